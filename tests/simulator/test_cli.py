"""`agent sim-device` as a real subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agent.config import AgentSettings
from agent.controller import line_protocol as lp
from agent.controller.driver import Unit
from agent.controller.interface import ControllerState, PointValue
from agent.controller.line_driver import LineDriver
from agent.controller.modbus_driver import ModbusDriver
from agent.controller.sim_profile import SIM
from tests.support.controllers import one_controller


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
        async with one_controller(found["device"][0]) as controller:
            assert (await controller.read_state()).setpoint == 23.0
        process.send_signal(signum)
        assert await asyncio.wait_for(process.wait(), 10.0) == 0
        assert process.stderr is not None
        assert b"Traceback" not in await process.stderr.read()


async def test_pty_link_appears_and_is_removed_on_exit(tmp_path: Path) -> None:
    link = tmp_path / "ttySIM"
    async with sim_device("--pty", str(link), "--setpoint", "21.5") as (process, ready):
        assert ready == f"device {link}"
        assert link.is_symlink()
        async with one_controller(str(link)) as controller:
            assert (await controller.read_state()).setpoint == 21.5
            assert await controller.write_setpoint(22) == 22.0
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


async def ask(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], data: bytes) -> bytes:
    reader, writer = conn
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readline(), 5.0)


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.split("://")[1].rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


def line(payload: str, checksum: bool = True) -> bytes:
    return lp.encode_line(payload, with_checksum=checksum)


async def test_a_line_of_32_units() -> None:
    async with sim_device("--units", "32", "--tcp", "0", "--panel", "0") as (process, ready):
        found = endpoints(ready)
        assert list(found) == ["device", "panel"]
        device, panel = await connect(found["device"][0]), await connect(found["panel"][0])
        try:
            assert await ask(device, line("@32 GET SP")) == line("@32 SP 20.0")
            assert await ask(panel, b"@3 PANEL SP 19.0\n") == line("@3 OK SP 19.0", False)
            assert await ask(panel, b"@33 GET SP\n") == line("@33 ERR ADDRESS", False)
            device[1].write(line("GET SP"))  # unaddressed: nobody answers
            assert await ask(device, line("@3 GET SP")) == line("@3 SP 19.0")
            assert await ask(device, line("@1 ID")) == line("@1 ID SIM-TSTAT 1.0.0 SIM0001")
            assert await ask(panel, b"@1 FAULT SILENT 30\n") == b"@1 OK\r\n"
            device[1].write(line("@1 GET SP"))
            assert await ask(device, line("@2 GET SP")) == line("@2 SP 20.0")
            # Stopped with clients still connected: they are dropped, quietly.
            process.terminate()
            assert await asyncio.wait_for(process.wait(), 10.0) == 0
            assert await asyncio.wait_for(device[0].read(), 5.0) == b""
        finally:
            device[1].close()
            panel[1].close()
        assert process.stderr is not None
        assert await process.stderr.read() == b""


async def test_a_modbus_line(tmp_path: Path) -> None:
    pymodbus = pytest.importorskip("pymodbus")
    from pymodbus.client import ModbusSerialClient

    link = tmp_path / "ttyRTU"
    args = ("--units", "4", "--modbus", "--pty", str(link), "--emulate-baud", "19200")
    async with sim_device(*args, "--setpoint", "21.5") as (process, ready):
        assert ready == f"device {link}"

        def read() -> list[int]:
            client = ModbusSerialClient(
                str(link), framer=pymodbus.FramerType.RTU, parity="N", timeout=1.0, retries=0
            )
            assert client.connect()
            try:
                return list(client.read_holding_registers(0, count=2, device_id=4).registers)
            finally:
                client.close()

        assert await asyncio.to_thread(read) == [215, 180]
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10.0) == 0


@pytest.mark.parametrize("units", ["0", "248", "many"])
async def test_units_out_of_range_are_a_usage_error(units: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent",
        "sim-device",
        "--units",
        units,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 20.0)
    assert process.returncode == 2
    assert b"--units" in err


async def test_help_documents_the_line_and_its_panel() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "sim-device", "--help", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(process.communicate(), 20.0)
    for text in (b"--units N", b"--modbus", b"--emulate-baud BAUD", b"@3 FAULT SILENT 10"):
        assert text in out
    for fault in (b"UNPLUG", b"SILENT", b"GARBAGE", b"SLOW", b"STRAY", b"BADSUM", b"NOSUM"):
        assert b"FAULT " + fault in out
    for panel in (b"PANEL H 19.0", b"PANEL M COOL", b"PANEL F LOW", b"PANEL O 0", b"GET POINTS"):
        assert panel in out
    assert b'"profile": "sim"' in out


@pytest.mark.parametrize("driver", ["line", "modbus"])
async def test_the_sim_profile_keeps_every_point_of_a_sim_device(
    driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`AGENT_DEVICES='[{"id": "t01", "address": 1, "profile": "sim"}]'` on a line served by
    `agent sim-device --units N` (either protocol): the driver the settings pick reads every
    point in one transaction and writes each of them."""
    for name in [n for n in os.environ if n.upper().startswith("AGENT_")]:
        monkeypatch.delenv(name)
    options = ["--units", "2", "--panel", "0"] + (["--modbus"] if driver == "modbus" else [])
    async with sim_device(*options) as (process, ready):
        found = endpoints(ready)
        settings = AgentSettings(
            line_id="floor3",
            serial={"url": found["device"][0], "driver": driver, "reply_timeout_s": 0.5},
            devices='[{"id": "t01", "address": 1, "profile": "sim"}]',
        )
        device = settings.line.devices[0]
        assert device.resolved_profile is SIM
        unit = Unit(device.id, device.address, profile=device.resolved_profile)
        host, port = found["panel"][0].removeprefix("tcp://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"@1 PANEL F LOW\n")
        assert await asyncio.wait_for(reader.readline(), 5.0) == b"@1 OK F LOW\r\n"
        writer.close()
        serial = settings.serial
        bus = (
            ModbusDriver(serial.url, reply_timeout_s=serial.reply_timeout_s)
            if driver == "modbus"
            else LineDriver(serial.url, reply_timeout_s=serial.reply_timeout_s)
        )

        def work() -> tuple[ControllerState, dict[str, PointValue], ControllerState]:
            bus.open()
            try:
                before = bus.read_state(unit)
                written = {
                    point: bus.write_point(unit, point, value)
                    for point, value in (
                        ("setPoint", 22.0),
                        ("heatSetPoint", 18.5),
                        ("coolSetPoint", 26.0),
                        ("mode", "cool"),
                        ("fan", "high"),
                        ("occupied", False),
                    )
                }
                return before, written, bus.read_state(unit)
            finally:
                bus.close()

        before, written, after = await asyncio.to_thread(work)
        assert before.value("fan") == "low" and before.value("humidity") == 45.0
        assert set(before.points) == set(SIM.points) - {"setPoint"}
        assert written == {
            "setPoint": 22.0,
            "heatSetPoint": 18.5,
            "coolSetPoint": 26.0,
            "mode": "cool",
            "fan": "high",
            "occupied": False,
        }
        assert {point: after.value(point) for point in written} == written
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10.0) == 0
