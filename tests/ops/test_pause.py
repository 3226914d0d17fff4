"""`agent pause` / `agent resume`: maintenance mode of a line served by agent processes."""

from __future__ import annotations

import re
import signal
import time

from tests.ops.support import Topics, command, health_topic, status, wait_in_sync, wait_pair
from tests.support.rig import ACTIVE, STANDBY, LineRig

LINE = LineRig.LINE
LOCK = f"{LINE}\\lock"


def connections(line: LineRig) -> int:
    """Open connections to the fake line (each agent driving it holds one)."""
    return line.background.call(lambda: line.device.open_connections)


def wait_connections(line: LineRig, count: int, timeout: float = 10.0) -> None:
    """Until `count` connections are open (connections are not line events the fake
    announces: looked at until then)."""
    deadline = time.monotonic() + timeout
    while connections(line) != count:
        assert time.monotonic() < deadline, f"{connections(line)} connections, not {count}"
        time.sleep(0.02)


def requests(line: LineRig) -> int:
    return line.background.call(lambda: line.device.counters.requests)


def wait_renewals(line: LineRig, instance: str, count: int) -> None:
    assert line.client.request("KEYNOTIFY", LOCK).payload == b"+OK\r\n"
    while not line.client.notifications.empty():
        line.client.notifications.get_nowait()
    for _ in range(count):
        line.expect_renewal(instance, timeout=5)


def test_pause_leaves_the_line_alone_and_resume_reconciles_both_ways(
    line: LineRig, topics: Topics
) -> None:
    first, _ = line.start_active("a")
    line.start_agent("b").wait_for_new(STANDBY)
    wait_pair(topics, LINE, "a", "b")
    wait_in_sync(topics, line.device_ids)
    # The active's connection; the standby's readiness check connects for a moment too
    # (and is closed at once, with nothing sent): waited out, not counted.
    wait_connections(line, 1)

    paused = command(line, "pause", "t01", "--reason", "new wiring")
    assert paused.returncode == 0, paused.stderr
    assert "paused by its active a" in paused.stdout
    first.wait_for(re.compile(r"line paused \(new wiring, by .*\): the line is closed"))
    wait_connections(line, 0)  # the port is closed: the technician has the bus
    quiet_from = requests(line)
    code, document = status(line, LINE)
    assert code == 6 and document["lines"][0]["verdict"].startswith("paused: new wiring, by ")
    for device in ("t01", "t02", "t03", "t04"):
        topics.wait(f"devices/{device}/availability", lambda p: p == b"offline", parse=False)

    # Changes on both sides while paused: a panel on t01, the store on t02, both on t03.
    line.background.call(lambda: line.unit(1).panel_setpoint(17.5))
    line.background.call(lambda: line.unit(3).panel_setpoint(16.0))
    assert line.remote_set_device(2, b"25.0") == b"+OK\r\n"  # the lock is still a's
    assert line.remote_set_device(3, b"26.0") == b"+OK\r\n"
    # The active keeps the lock for more than a lease: the standby does not take over.
    wait_renewals(line, "a", 3)
    assert line.setpoint_in_store(1) == b"20.0"  # nothing published
    assert line.writes(2) == []  # nothing written
    assert requests(line) == quiet_from  # nobody on the line
    assert command(line, "pause", LINE).returncode == 1  # already paused

    mark = topics.count("devices/t03/status")
    resumed = command(line, "resume", LINE)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed by its active a" in resumed.stdout
    first.wait_for(re.compile(r"line resumed: reconciling every device"))
    line.wait_store({1: b"17.5", 2: b"25.0"})
    line.wait_line(lambda fake: fake.unit(2).setpoint == 25.0)
    assert line.writes(2) == [25.0]
    # Crossing changes on t03 end with store and controller equal, by the crossing rule.
    topics.wait("devices/t03/status", lambda d: d["in_sync"], after=mark)
    unit_3 = line.background.call(lambda: line.unit(3).setpoint)
    assert unit_3 in (16.0, 26.0) and line.setpoint_in_store(3) == f"{unit_3}".encode()
    wait_in_sync(topics, line.device_ids)
    assert status(line, LINE)[0] == 0
    assert command(line, "resume", LINE).returncode == 1  # not paused


def test_a_pause_survives_a_failover(line: LineRig, topics: Topics) -> None:
    first, _ = line.start_active("a")
    second = line.start_agent("b")
    second.wait_for_new(STANDBY)
    wait_pair(topics, LINE, "a", "b")
    assert command(line, "pause", LINE).returncode == 0
    first.signal(signal.SIGKILL)
    # b takes the lock when a's lease runs out, and leaves the line closed.
    second.wait_for_new(ACTIVE, timeout=10)
    second.wait_for(re.compile(r"the line is paused: it stays closed until resumed"))
    assert line.remote_set_device(4, b"22.5") == b"+OK\r\n"
    code, document = status(line, LINE)
    assert code == 6 and document["lines"][0]["holder"] == "b"
    wait_renewals(line, "b", 2)
    assert connections(line) == 0 and line.writes(4) == []

    assert command(line, "resume", LINE).returncode == 0
    line.wait_line(lambda fake: fake.unit(4).setpoint == 22.5)
    topics.wait(health_topic(LINE, "b"), lambda d: d["state"] == "running" and not d["paused"])
