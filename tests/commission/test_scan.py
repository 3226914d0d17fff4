"""`agent scan` as an operator runs it: a process against the fake line (TCP, or a pty for a
local port), and against the embedded store for the line's lock."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.commission.scan import PortBusy, check_port_free, holders
from agent.controller.driver import PortClaim
from agent.simulator.line import FakeLine
from tests.support.rig import RECONCILED, BackgroundLoop, LineRig

# 32 units at mixed addresses in 1..41: two at 23 (a collision), the one at 37 dead.
ADDRESSES = sorted(set(range(1, 42)) - {4, 9, 13, 17, 22, 28, 31, 36, 40})
DOUBLED, SILENT = 23, 37
SPAN = "1-42"
QUICK = ("--reply-timeout-ms", "60")
"""A reply timeout the fake (in this process) meets on a loaded machine too."""
FAST = (*QUICK, "--baud", "115200")
"""On TCP the baud rate only times the scan: a request's line time is short at this one."""


def agent(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    return subprocess.run(
        [sys.executable, "-m", "agent", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


class Lines(BackgroundLoop):
    """Fake lines of the 32 units, each stopped at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.served: list[FakeLine] = []

    def close(self) -> None:
        for line in self.served:
            self.run(line.stop())
        super().close()


@pytest.fixture
def background() -> Iterator[Lines]:
    loop = Lines()
    try:
        yield loop
    finally:
        loop.close()


def serve(background: Lines, *, modbus: bool = False, **start: Any) -> FakeLine:
    line = FakeLine(addresses=ADDRESSES, modbus=modbus, doubled=[DOUBLED], silent=[SILENT])
    background.run(line.start(**(start or {"tcp_port": 0})))
    background.served.append(line)
    return line


def answering() -> list[int]:
    return [a for a in ADDRESSES if a not in (DOUBLED, SILENT)]


def test_the_fake_line_has_32_units() -> None:
    assert len(ADDRESSES) == 32 and DOUBLED in ADDRESSES and SILENT in ADDRESSES


@pytest.mark.parametrize("protocol", ["line", "modbus"])
def test_scan_finds_every_unit_reports_the_collision_and_writes_a_devices_file(
    background: Lines, tmp_path: Path, protocol: str
) -> None:
    line = serve(background, modbus=protocol == "modbus")
    output = tmp_path / "floor3.devices.json"
    # A reply timeout of 200 ms: the collision is two replies at once, and a loaded machine
    # once heard none of it within 60 ms (the scan said the line clean).
    result = agent(
        "scan", str(line.tcp_url), "--protocol", protocol, "--addresses", SPAN, *FAST,
        "--reply-timeout-ms", "200",
        "--profile", "sim", "--line-id", "floor3", "--output", str(output), "--no-store",
    )  # fmt: skip
    assert result.returncode == 5, result.stdout + result.stderr  # units, and a collision
    found = [int(a) for a in re.findall(r"^  @(\d+) +\S.*points of sim", result.stdout, re.M)]
    assert found == answering(), result.stdout
    assert re.search(rf"^  @{DOUBLED} +COLLISION", result.stdout, re.M), result.stdout
    assert f"SIM{ADDRESSES[0]:04d}" in result.stdout  # what the unit says of itself
    assert "8/8 points of sim" in result.stdout
    assert re.search(r"in [\d.]+ s; the line's floor [\d.]+ s", result.stdout)
    devices = json.loads(output.read_text())["devices"]
    assert [d["address"] for d in devices] == answering()
    config = agent(
        "--line-id", "floor3", "--serial-driver", protocol, "--serial-url", str(line.tcp_url),
        "--devices-file", str(output), "--print-config",
    )  # fmt: skip
    assert config.returncode == 0, config.stderr
    derived = json.loads(config.stdout)["derived"]["devices"]
    assert sorted(d["address"] for d in derived.values()) == answering(), config.stdout


@pytest.mark.parametrize("protocol", ["line", "modbus"])
def test_a_unit_slower_than_the_reply_timeout_is_found_and_said_late(
    background: Lines, protocol: str
) -> None:
    line = FakeLine(addresses=[1, 2, 3], modbus=protocol == "modbus")
    background.run(line.start(tcp_port=0))
    background.served.append(line)
    background.call(lambda: line.unit(2).fault("SLOW", 250))  # past the 60 ms timeout
    result = agent(
        "scan", str(line.tcp_url), "--protocol", protocol, "--addresses", "1-4", *FAST,
        "--profile", "sim", "--no-store",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.findall(r"^  @(\d+) +\S.* 8/8 points of sim", result.stdout, re.M)
    assert found == ["1", "2", "3"], result.stdout
    assert re.search(r"^  @2 +LATE: answered after the reply timeout", result.stdout, re.M)
    # Others may be late too: 3 waits for 2's reply, and on a loaded machine any unit can
    # miss a 60 ms timeout. That only the addresses heard late are asked again is the
    # sweep's own test (tests/commission/test_sweep.py).


def test_each_setting_is_tried_on_a_local_port_but_not_on_a_socket(
    background: Lines, tmp_path: Path
) -> None:
    line = serve(background, pty_link=tmp_path / "ttyS9", tcp_port=0)
    local = agent(
        "scan", str(line.pty_link), "--addresses", "1-4", "--baud", "9600,19200", *QUICK,
        "--no-store", "--lock-dir", str(tmp_path),
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    assert "9600 8N1: 3 units" in local.stdout and "19200 8N1: 3 units" in local.stdout
    remote = agent(
        "scan", str(line.tcp_url), "--addresses", "1-4", "--baud", "9600,19200", *QUICK,
        "--no-store",
    )  # fmt: skip
    assert "cannot change: scanning once, timed for 9600 8N1" in remote.stdout
    assert "19200" not in remote.stdout.split("\n", 1)[1]


# --- refusals --------------------------------------------------------------------------------


class ScanRig(LineRig):
    """A line of a few units whose agents the test starts, or not."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path, 3, served_before=False)

    def scan(self, *args: str) -> subprocess.CompletedProcess[str]:
        return agent(
            "scan", str(self.device.tcp_url), "--addresses", "1-4", *FAST,
            "--line-id", self.LINE, "--host", "127.0.0.1", "--port", str(self.port), *args,
        )  # fmt: skip


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[ScanRig]:
    rig = ScanRig(tmp_path)
    try:
        yield rig
    finally:
        rig.close()


def test_a_line_whose_lock_an_agent_holds_is_refused_until_it_is_paused(rig: ScanRig) -> None:
    rig.background.call(lambda: rig._write(rig.lock_key, b"gw-a:1f2e3d"))
    refused = rig.scan()
    assert refused.returncode == 8, refused.stdout + refused.stderr
    assert "driven by agent instance gw-a" in refused.stderr
    assert "agent pause floor3" in refused.stderr
    assert not [r for r in rig.device.records if r.client.startswith("tcp")]
    rig.background.call(
        lambda: rig._write(f"{rig.LINE}\\paused", b'{"by": "ops@host", "at": "now"}')
    )
    scanned = rig.scan()
    assert scanned.returncode == 0, scanned.stderr
    assert "line floor3 is paused" in scanned.stdout and "3 units" in scanned.stdout


def test_without_the_store_the_scan_says_so(rig: ScanRig) -> None:
    result = agent("scan", str(rig.device.tcp_url), "--line-id", "floor3", "--port", "1")
    assert result.returncode == 4, result.stdout + result.stderr
    usage = agent("scan", str(rig.device.tcp_url))
    assert usage.returncode == 2 and "--no-store" in usage.stderr


def test_a_port_that_cannot_be_opened_is_said(tmp_path: Path) -> None:
    result = agent("scan", str(tmp_path / "ttyUSB9"), "--no-store", "--lock-dir", str(tmp_path))
    assert result.returncode == 4 and "cannot open" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_process_that_has_a_file_open_is_found(tmp_path: Path) -> None:
    device = tmp_path / "ttyUSB0"
    device.write_bytes(b"")
    with device.open("rb") as held:
        child = subprocess.Popen(["sleep", "30"], stdin=held)
    try:
        assert holders(str(device)) == [child.pid]
        with pytest.raises(PortBusy, match=f"open in process {child.pid}"):
            check_port_free(str(device))
    finally:
        child.kill()
        child.wait()
    check_port_free(str(device))


def test_a_local_port_another_process_locked_or_an_agent_claimed_is_refused(
    background: Lines, tmp_path: Path
) -> None:
    line = serve(background, pty_link=tmp_path / "ttyS0")
    path = str(line.pty_link)
    fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = agent("scan", path, "--no-store", "--lock-dir", str(tmp_path), *QUICK)
        assert result.returncode == 9, result.stdout + result.stderr
        assert "locked by another process" in result.stderr
    finally:
        os.close(fd)
    claim = PortClaim(path, tmp_path)
    claim.take()
    try:
        result = agent("scan", path, "--no-store", "--lock-dir", str(tmp_path), *QUICK)
        assert result.returncode == 9 and "served by another agent" in result.stderr
    finally:
        claim.release()
    assert not line.records


# --- a devices file that serves the line at once ---------------------------------------------


class MixedLineRig(LineRig):
    """The line of 32 at mixed addresses, its devices file written by a scan."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path, len(ADDRESSES), served_before=False)
        self.devices_file = tmp_path / "floor3.devices.json"

    def _make_device(self) -> Any:
        return FakeLine(addresses=ADDRESSES, doubled=[DOUBLED], silent=[SILENT])

    def env(self, instance: str, **extra: str) -> dict[str, str]:
        env = super().env(instance, **extra)
        del env["AGENT_DEVICES"]
        env["AGENT_DEVICES_FILE"] = str(self.devices_file)
        return env


@pytest.mark.slow
def test_the_devices_file_a_scan_wrote_serves_the_line(tmp_path: Path) -> None:
    rig = MixedLineRig(tmp_path)
    try:
        scanned = agent(
            "scan", str(rig.device.tcp_url), "--addresses", SPAN, *QUICK, "--profile", "sim",
            "--line-id", rig.LINE, "--output", str(rig.devices_file), "--no-store",
        )  # fmt: skip
        assert scanned.returncode == 5, scanned.stderr
        process = rig.start_agent("a")
        process.wait_for(RECONCILED, timeout=30)
        for address in answering():  # every unit found is served: its set point published
            key = f"floor3-{address:03d}\\setPoint"
            assert rig.wait_key(key, lambda value: value is not None, timeout=20) == b"20.0"
    finally:
        rig.close()


@pytest.mark.slow
def test_a_line_an_agent_drives_is_refused_naming_it_and_scanned_once_paused(
    rig: ScanRig,
) -> None:
    rig.start_active("gw-a")
    refused = rig.scan()
    assert refused.returncode == 8, refused.stdout + refused.stderr
    assert "driven by agent instance gw-a" in refused.stderr
    paused = agent("pause", rig.LINE, "--host", "127.0.0.1", "--port", str(rig.port))
    assert paused.returncode == 0, paused.stderr
    scanned = rig.scan()
    assert scanned.returncode == 0, scanned.stderr
    assert "3 units" in scanned.stdout
