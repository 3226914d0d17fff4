"""What `agent emulator --data-dir` acknowledged stays: kill -9 at the worst moment, a slow
fsync (strace's fault injection), each --fsync mode. Real processes throughout."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.emulator import persistence
from tests.emulator.test_cli import READY
from tests.support.paho_client import PahoStoreClient
from tests.support.processes import AgentProcess

STRACE = shutil.which("strace")
# Skipped where strace is not installed, except in CI (the README's test command installs it).
needs_strace = pytest.mark.skipif(
    STRACE is None and not os.environ.get("CI"), reason="strace (Debian package strace) absent"
)
OK = b"+OK\r\n"
_PID = re.compile(r"pid (\d+)")


def slow_fsync(delay_ms: int) -> list[str]:
    """A prefix that runs the emulator with every fsync (and fdatasync) taking ``delay_ms``
    longer, as on a busy SD card."""
    assert STRACE is not None
    return [
        STRACE, "-f", "-qq", "-o", os.devnull, "--seccomp-bpf",
        "-e", "trace=fsync,fdatasync", "-e", "signal=none",
        "-e", f"inject=fsync,fdatasync:delay_enter={delay_ms * 1000}",
    ]  # fmt: skip


def start(data: Path, *args: str, prefix: Sequence[str] = ()) -> tuple[AgentProcess, int]:
    process = AgentProcess(
        ["emulator", "--port", "0", "--data-dir", str(data), *args],
        merge_stderr=True,
        prefix=prefix,
    )
    return process, int(process.wait_for(READY, timeout=20).group(3))


def emulator_pid(data: Path) -> int:
    """The emulator's own pid (under strace, the process started is strace)."""
    match = _PID.search((data / persistence.LOCK_NAME).read_text())
    assert match is not None
    return int(match.group(1))


def stop_traced(process: AgentProcess, data: Path) -> int:
    """Stops an emulator started under strace as SIGTERM stops it (strace does not pass on
    the signal it gets)."""
    os.kill(emulator_pid(data), signal.SIGTERM)
    return process.stop()


def value_after_kill_9(data: Path, writes: int, mode: str | None) -> bytes:
    """``writes`` awaited SETs of one key, kill -9 right after the last acknowledgement,
    a restart on the same directory: what the key holds then."""
    mode_args = [] if mode is None else ["--fsync", mode]
    process, port = start(data, *mode_args, prefix=slow_fsync(5))
    client = PahoStoreClient("127.0.0.1", port, "writer")
    try:
        for index in range(1, writes + 1):
            assert client.request("SET", "counter", str(index)).payload == OK
        os.kill(emulator_pid(data), signal.SIGKILL)
    finally:
        client.drop()
        process.stop()
    process, port = start(data)
    client = PahoStoreClient("127.0.0.1", port, "reader")
    try:
        return client.request("GET", "counter").payload
    finally:
        client.close()
        assert process.stop() == 0


@needs_strace
@pytest.mark.parametrize("mode", [None, "everysec"])
def test_what_was_acknowledged_survives_a_kill_9(tmp_path: Path, mode: str | None) -> None:
    """Was: a reply went out before its record reached the file; a kill -9 right after the
    50th acknowledged SET found 44 of them after the restart, in 7 rounds of 10."""
    assert value_after_kill_9(tmp_path, 50, mode) == b"$2\r\n50\r\n"


@pytest.mark.slow
@needs_strace
@pytest.mark.parametrize("mode", ["always", "everysec", "no"])
def test_what_was_acknowledged_survives_a_kill_9_round_after_round(
    tmp_path: Path, mode: str
) -> None:
    for round_ in range(10):
        data = tmp_path / f"round-{round_}"
        assert value_after_kill_9(data, 50, mode) == b"$2\r\n50\r\n", f"round {round_}"


@needs_strace
def test_one_fsync_answers_every_set_that_arrived_meanwhile(tmp_path: Path) -> None:
    """Group commit: 20 SETs sent at once over a 150 ms fsync are answered after two
    fsyncs (the first SET's, then one for the other 19), not twenty."""
    process, port = start(tmp_path, prefix=slow_fsync(150))
    client = PahoStoreClient("127.0.0.1", port, "writer")
    try:
        assert client.request("SET", "warm", "up").payload == OK  # the start's fsyncs done
        started = time.monotonic()
        waiters = [client.send("SET", f"k{index}", "v") for index in range(20)]
        assert [w.get(timeout=10).payload for w in waiters] == [OK] * 20
        # Two fsyncs, not twenty (3 s): the bound leaves a loaded machine a second of slack.
        assert time.monotonic() - started < 10 * 0.15
    finally:
        client.close()
        assert stop_traced(process, tmp_path) == 0
