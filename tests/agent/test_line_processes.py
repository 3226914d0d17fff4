"""One agent per line, as real processes: 32 thermostats on one fake line, a pair serving it,
units that fail, devices that come and go, settings that make no sense."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.emulator.embedded import EmbeddedStateStore
from agent.emulator.store import Access
from agent.simulator.line import FakeLine
from tests.support.processes import AgentProcess
from tests.support.rig import ACTIVE, STANDBY, BackgroundLoop, LineRig, line_rig

UNITS = 32


@pytest.fixture
def line(tmp_path: Path) -> Iterator[LineRig]:
    with line_rig(tmp_path, UNITS) as rig:
        yield rig


def all_at(value: bytes, addresses: range | list[int]) -> dict[int, bytes]:
    return dict.fromkeys(addresses, value)


def test_a_line_of_32_devices_syncs_both_ways(line: LineRig) -> None:
    line.start_active("a")
    line.wait_store(all_at(b"20.0", range(1, UNITS + 1)))
    # Remote changes to eight devices and panel changes at eight others, all at once.
    for n in range(1, 9):
        assert line.remote_set_device(n, f"{20 + n}.0".encode()) == b"+OK\r\n"
    for n in range(9, 17):
        line.background.call(lambda n=n: line.unit(n).panel_setpoint(10 + n))
    expected = {n: f"{20 + n}.0".encode() for n in range(1, 9)}
    expected |= {n: f"{10 + n}.0".encode() for n in range(9, 17)}
    line.wait_store(expected)
    line.wait_line(lambda fake: all(fake.unit(n).setpoint == 20 + n for n in range(1, 9)))
    for n in range(1, UNITS + 1):
        assert line.writes(n) == ([20.0 + n] if n <= 8 else []), n


def test_crossing_changes_on_several_devices_end_by_the_crossing_rule(line: LineRig) -> None:
    # A long poll interval: the panel changes are unnoticed when the remote ones come. A
    # lease of 6 s: a loaded machine starved an agent of 32 devices past one of 1.5 s.
    agent, _ = line.start_active(
        "a", AGENT_SERIAL__POLL_INTERVAL_S="600", AGENT_LOCK__TTL_MS="6000"
    )
    crossing = [3, 11, 19, 27]
    for n in crossing:
        line.background.call(lambda n=n: line.unit(n).panel_setpoint(15.0))
    for n in crossing:
        line.remote_set_device(n, b"25.0")
    # Each panel change reached the store last (found while applying the remote change).
    line.wait_store(all_at(b"15.0", crossing))
    for n in crossing:
        assert line.writes(n) == []
        agent.wait_for(re.compile(rf"t{n:02d}.*crossed"))


def test_a_pair_serving_a_line_fails_over_and_hands_over(line: LineRig) -> None:
    first, _ = line.start_active("a")
    second = line.start_agent("b")
    second.wait_for_new(STANDBY)
    line.wait_store(all_at(b"20.0", range(1, UNITS + 1)))
    first.signal(signal.SIGKILL)
    # Changes made during the failover, to many devices: none is lost.
    for n in range(1, UNITS + 1, 3):
        line.remote_set_device(n, b"23.5")
    second.wait_for_new(ACTIVE, timeout=10)
    changed = list(range(1, UNITS + 1, 3))
    line.wait_line(lambda fake: all(fake.unit(n).setpoint == 23.5 for n in changed))
    line.wait_store(all_at(b"23.5", changed))
    # The first comes back as standby; a SIGTERM of the active hands over at once.
    again = line.start_agent("a")
    again.wait_for_new(STANDBY)
    second.signal(signal.SIGTERM)
    again.wait_for_new(ACTIVE, timeout=5)
    assert second.proc.wait(10) == 0
    line.remote_set_device(32, b"24.0")
    line.wait_line(lambda fake: fake.unit(32).setpoint == 24.0)
    for n in range(1, UNITS + 1):
        assert line.writes(n) == ([23.5] if n in changed else []) + ([24.0] if n == 32 else [])


def test_a_silent_unit_and_a_garbling_unit_do_not_hold_up_the_others(line: LineRig) -> None:
    agent, _ = line.start_active("a", AGENT_SERIAL__PROBE_INTERVAL_S="2")
    line.wait_store(all_at(b"20.0", range(1, UNITS + 1)))
    line.background.call(lambda: line.unit(7).fault("SILENT", 600))
    line.background.call(lambda: line.unit(8).fault("GARBAGE", 10_000))
    # Both leave the cycle (t08 for its garbage), in either order.
    agent.wait_for(re.compile(r"t07: not answering; quarantined"), timeout=10)
    for n in (1, 16, 32):
        line.remote_set_device(n, b"26.0")
    line.wait_line(lambda fake: all(fake.unit(n).setpoint == 26.0 for n in (1, 16, 32)))
    # A change for the silent unit waits for it; it is applied once it answers again.
    line.remote_set_device(7, b"27.0")
    line.background.call(lambda: line.unit(7).fault("CLEAR"))
    line.wait_line(lambda fake: fake.unit(7).setpoint == 27.0, timeout=10)
    agent.drain()
    assert not any("line lost" in x for x in agent.lines), "the port was never closed"


def test_the_line_unplugged_and_back(line: LineRig) -> None:
    agent, _ = line.start_active("a")
    line.wait_store(all_at(b"20.0", range(1, UNITS + 1)))
    line.background.call(lambda: line.device.fault("UNPLUG", 2.0))
    agent.wait_for_new(re.compile("line lost"))
    line.remote_set_device(5, b"21.5")  # cannot be applied now
    line.background.call(lambda: line.unit(6).panel_setpoint(18.0))
    agent.wait_for_new(re.compile("line reopened"), timeout=15)
    line.wait_line(lambda fake: fake.unit(5).setpoint == 21.5)
    # Unit 6 came back from the line's absence with another value: the store's goes back to
    # it (AGENT_SERIAL__AFTER_ABSENCE=store), said so.
    agent.wait_for_new(
        re.compile(r"WARNING \[floor3/t06 a\] agent: set point back after an absence")
    )
    line.wait_line(lambda fake: fake.unit(6).setpoint == 20.0)
    line.wait_store({5: b"21.5", 6: b"20.0"})


def test_devices_removed_and_added_across_a_restart(line: LineRig) -> None:
    agent, _ = line.start_active("a", AGENT_DEVICES="t01@1,t02@2,t03@3")
    line.wait_store(all_at(b"20.0", [1, 2, 3]))
    line.remote_set_device(2, b"22.0")
    line.wait_line(lambda fake: fake.unit(2).setpoint == 22.0)
    assert agent.stop() == 0
    # t03 goes, t04 comes (its key already written by someone, before any agent served it).
    line.client.request("SET", "t04\\setPoint", b"24.0")
    line.background.call(lambda: line.unit(1).panel_setpoint(19.0))  # while nobody serves
    restarted, _ = line.start_active("a", AGENT_DEVICES="t01@1,t02@2,t04@4")
    line.wait_store({1: b"19.0", 2: b"22.0", 4: b"24.0"})
    line.wait_line(lambda fake: fake.unit(4).setpoint == 24.0)
    assert line.setpoint_in_store(3) == b"20.0"  # left as it was: nobody serves t03 now
    restarted.drain()
    assert not any("t03" in x for x in restarted.lines)


class RefusingStore(LineRig):
    """The broker's rules let agents write t03's set point no more, and t04 not at all."""

    def _make_store(self) -> EmbeddedStateStore:
        def rules(client_id: str, key: bytes, access: Access) -> bool:
            if not client_id.startswith("agent-"):
                return True
            if key == b"t03\\setPoint" and access is Access.WRITE:
                return False
            return not key.startswith(b"t04\\")

        return EmbeddedStateStore("127.0.0.1", self.port, authorizer=rules)


def test_keys_the_store_refuses_are_said_once_and_the_rest_is_served(tmp_path: Path) -> None:
    rig = RefusingStore(tmp_path, 4)
    try:
        rig.client.request("SET", "t03\\setPoint", b"20.0")
        agent, _ = rig.start_active("a")
        agent.wait_for(re.compile(r"device t04 is not served: .*t04\\setPoint"))
        rig.wait_store(all_at(b"20.0", [1, 2]))
        # t03: remote changes still reach the controller; its panel changes cannot reach
        # the store, which is said once, not at every poll, and counted.
        rig.remote_set_device(3, b"23.0")
        rig.wait_line(lambda fake: fake.unit(3).setpoint == 23.0)
        rig.background.call(lambda: rig.unit(3).panel_setpoint(19.0))
        refused = re.compile(r"refuses to let this agent write t03\\setPoint")
        agent.wait_for(refused)  # at takeover already: fencing the key
        rig.background.call(lambda: rig.unit(1).panel_setpoint(18.0))
        rig.wait_store({1: b"18.0"})  # the others are served meanwhile
        rig.client.subscribe("devices/t03/telemetry")
        deadline = time.monotonic() + 10
        while True:
            body = json.loads(rig.client.other.get(timeout=10).payload)
            if body["errors"]["not_authorized"] >= 2:
                break
            assert time.monotonic() < deadline, body
        agent.drain()
        assert sum(bool(refused.search(line)) for line in agent.lines) == 1
        assert rig.writes(4) == []
    finally:
        rig.close()


# ------------------------------------------------------------------ settings at start


def run_agent(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    return subprocess.run(
        [sys.executable, "-m", "agent", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ("t01@1,t02@1", "address 1 is given to both t01 and t02"),
        ("t01@1,t01@2", "device t01 is given twice"),
        ("t01@0", "greater than or equal to 1"),
        ("t01@248", "less than or equal to 247"),
        ("t01", "expected id@address"),
        ('[{"id": "t01", "address": 1, "modbus": {"scale": -1}}]', "greater than 0"),
        # Was: taken for left out, and the line's id served as a phantom single device.
        ("", "empty: list the line's devices"),
        (" ", "empty: list the line's devices"),
    ],
)
def test_devices_that_make_no_sense_are_refused_at_start(devices: str, message: str) -> None:
    env = {"AGENT_LINE_ID": "l", "AGENT_DEVICES": devices, "AGENT_SERIAL__URL": "socket://x:1"}
    result = run_agent(env)
    assert result.returncode == 78, result.stderr
    assert "AGENT_DEVICES" in result.stderr and message in result.stderr


def test_a_line_without_its_id_is_refused() -> None:
    result = run_agent({"AGENT_DEVICES": "t01@1", "AGENT_SERIAL__URL": "socket://x:1"})
    assert result.returncode == 78 and "AGENT_LINE_ID" in result.stderr


def test_two_lines_on_one_port_are_refused(tmp_path: Path) -> None:
    background = BackgroundLoop()
    fake = FakeLine(units=2)
    try:
        background.run(fake.start(pty_link=tmp_path / "ttyBUS"))
        # The same port under a second name, as /dev/serial/by-id/... and /dev/ttyUSB0 are.
        other_name = tmp_path / "ttyALIAS"
        other_name.symlink_to(os.path.realpath(tmp_path / "ttyBUS"))
        common = {
            "AGENT_SERIAL__LOCK_DIR": str(tmp_path),
            "AGENT_MQTT__HOST": "127.0.0.1",
            "AGENT_MQTT__PORT": "1",  # nothing listens: the port claim comes first
            "AGENT_STATE_DIR": str(tmp_path / "state"),
        }
        first = AgentProcess(
            [],
            env={
                **common,
                "AGENT_LINE_ID": "a",
                "AGENT_DEVICES": "t1@1",
                "AGENT_SERIAL__URL": str(tmp_path / "ttyBUS"),
            },
            merge_stderr=True,
        )
        try:
            first.wait_for(re.compile("could not connect|connecting"), timeout=15)
            result = run_agent(
                {
                    **common,
                    "AGENT_LINE_ID": "b",
                    "AGENT_DEVICES": "t2@2",
                    "AGENT_SERIAL__URL": str(other_name),
                }
            )
            assert result.returncode == 78, result.stderr
            assert "AGENT_SERIAL__URL" in result.stderr and "another agent" in result.stderr
        finally:
            first.stop()
    finally:
        background.run(fake.stop())
        background.close()
