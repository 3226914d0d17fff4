"""`agent sim-device` as a real subprocess."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agent.controller.serial_driver import SerialController
from tests.controller.conftest import FAST


@asynccontextmanager
async def sim_device(*args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent",
        "sim-device",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        ready = await asyncio.wait_for(process.stdout.readline(), 20.0)
        yield process, ready.decode().strip()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def endpoints(ready: str) -> dict[str, list[str]]:
    words = ready.split()
    found: dict[str, list[str]] = {}
    for name, url in zip(words[0::2], words[1::2], strict=True):
        found.setdefault(name, []).append(url)
    return found


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_ready_line_and_clean_exit(signum: signal.Signals) -> None:
    async with sim_device("--tcp", "0", "--panel", "0") as (process, ready):
        found = endpoints(ready)
        assert found["device"][0].startswith("socket://127.0.0.1:")
        assert found["panel"][0].startswith("tcp://127.0.0.1:")
        host, port = found["panel"][0].removeprefix("tcp://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"PANEL SP 23\n")
        assert await asyncio.wait_for(reader.readline(), 5.0) == b"OK SP 23.0\r\n"
        writer.close()
        async with SerialController(found["device"][0], **FAST) as driver:
            assert (await driver.read_state()).setpoint == 23.0
        process.send_signal(signum)
        assert await asyncio.wait_for(process.wait(), 10.0) == 0
        assert process.stderr is not None
        assert b"Traceback" not in await process.stderr.read()


async def test_pty_link_appears_and_is_removed_on_exit(tmp_path: Path) -> None:
    link = tmp_path / "ttySIM"
    async with sim_device("--pty", str(link), "--setpoint", "21.5") as (process, ready):
        assert ready == f"device {link}"
        assert link.is_symlink()
        async with SerialController(str(link), **FAST) as driver:
            assert await driver.read_setpoint() == 21.5
            assert await driver.write_setpoint(22) == 22.0
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10.0) == 0
    assert not link.exists() and not link.is_symlink()


async def test_without_endpoints_it_serves_tcp() -> None:
    async with sim_device() as (process, ready):
        assert list(endpoints(ready)) == ["device"]
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10.0) == 0


async def test_help() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "sim-device", "--help", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(process.communicate(), 20.0)
    assert process.returncode == 0
    assert b"--pty LINK" in out and b"--panel PORT" in out


async def test_bad_limits_are_a_usage_error() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent",
        "sim-device",
        "--limits",
        "30",
        "10",
        "0.5",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 20.0)
    assert process.returncode == 2
    assert b"above max" in err
