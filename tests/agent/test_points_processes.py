"""Whole thermostats as real processes: units configured with the built-in profile `sim`, on
either protocol, kept in sync point by point both ways, through a failover, and with a
value against the deadband refused where `agent setpoint --wait` reads it."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.controller.interface import PointValue
from agent.protocol.hlc import Hlc
from agent.protocol.resp3 import encode_request
from tests.ops.support import command
from tests.support.points_rig import AT_START, WRITABLE, PointsRig
from tests.support.rig import ACTIVE, STANDBY

UNITS = 3
EXIT_REFUSED = 5
REMOTE: dict[str, PointValue] = {
    "setPoint": 22.5,
    "heatSetPoint": 19.0,
    "coolSetPoint": 26.5,
    "mode": "cool",
    "fan": "high",
    "occupied": False,
}
"""A change of every writable point, each to another value than the unit holds at start."""
PANEL: dict[str, PointValue] = {
    "setPoint": 18.5,
    "heatSetPoint": 17.5,
    "coolSetPoint": 27.0,
    "mode": "auto",
    "fan": "low",
    "occupied": False,
}
assert all(REMOTE[p] != AT_START[p] and PANEL[p] != AT_START[p] for p in WRITABLE)


# Modbus RTU the same way with -m slow: the drivers' point codecs are tested on their own.
@pytest.fixture(params=["line", pytest.param("modbus", marks=pytest.mark.slow)])
def line(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PointsRig]:
    rig = PointsRig(tmp_path, UNITS, modbus=request.param == "modbus")
    try:
        yield rig
    finally:
        rig.close()


def every_point(address: int, values: dict[str, PointValue]) -> dict[tuple[int, str], PointValue]:
    return {(address, point): value for point, value in values.items()}


def test_every_point_flows_both_ways(line: PointsRig) -> None:
    line.start_active("a")
    # Each unit's points published at start, every one in its own key.
    line.wait_points(
        {k: v for n in range(1, UNITS + 1) for k, v in every_point(n, AT_START).items()}
    )
    # Remote changes of every point of unit 1, panel changes of every point of unit 2.
    for point, value in REMOTE.items():
        assert line.remote_point(1, point, value) == b"+OK\r\n", point
    for point, value in PANEL.items():
        line.panel_point(2, point, value)
    line.wait_units(every_point(1, REMOTE))
    line.wait_points(every_point(1, REMOTE) | every_point(2, PANEL))
    for point in WRITABLE:
        assert line.point_writes(1, point) == [REMOTE[point]], point
        assert line.point_writes(2, point) == [], point  # never written back where it came from
        assert line.point_writes(3, point) == [], point
    # A read-only point the profile keeps in the store: humidity, when it moved by 5.
    line.panel_point(3, "humidity", 61.0)
    line.wait_points({(3, "humidity"): 61.0})
    assert line.store_value(line.point_key(3, "temperature")) is None  # not asked for


def test_no_point_change_is_lost_or_reverted_across_a_failover(line: PointsRig) -> None:
    # The first active polls rarely: the panel changes below are still unseen when it dies.
    first, _ = line.start_active("a", AGENT_SERIAL__POLL_INTERVAL_S="600")
    second = line.start_agent("b")
    second.wait_for_new(STANDBY)
    line.wait_points(every_point(1, AT_START) | every_point(2, AT_START) | every_point(3, AT_START))
    # Applied by the first active: its writes must stand after the takeover.
    for point, value in REMOTE.items():
        line.remote_point(1, point, value)
    line.wait_units(every_point(1, REMOTE))
    # Made at the panel and not yet published when the first active dies.
    for point, value in PANEL.items():
        line.panel_point(2, point, value)
    first.signal(signal.SIGKILL)
    # Made in the store while the line has no active.
    for point, value in REMOTE.items():
        line.remote_point(3, point, value)
    second.wait_for_new(ACTIVE, timeout=10)
    line.wait_units(every_point(1, REMOTE) | every_point(2, PANEL) | every_point(3, REMOTE))
    line.wait_points(every_point(1, REMOTE) | every_point(2, PANEL) | every_point(3, REMOTE))
    for point in WRITABLE:
        assert line.point_writes(1, point) == [REMOTE[point]], point  # not reverted, not redone
        assert line.point_writes(2, point) == [], point  # the panel's values never written over
        assert line.point_writes(3, point) == [REMOTE[point]], point
    assert line.wire_violations() == []


def test_a_takeover_fences_the_readings_it_publishes(line: PointsRig) -> None:
    """A 30-minute soak: the active, paused between its last look at its lease and its write
    of a reading (humidity), wrote it after the standby had taken over, and the store took it:
    it fences a key by the token of its last write, and nobody had written that key since.
    A takeover fences the keys of the readings it publishes, as it does its points'."""
    line.start_active("a")
    second = line.start_agent("b")
    second.wait_for_new(STANDBY)
    line.panel_point(3, "humidity", 61.0)
    line.wait_points({(3, "humidity"): 61.0})
    key = line.point_key(3, "humidity").encode()
    line.fault("SILENT", 60)  # the next active publishes no reading of its own meanwhile
    line.agents[0].signal(signal.SIGSTOP)  # its lease runs out
    second.wait_for_new(ACTIVE, timeout=10)

    def late_write() -> bytes:  # the former active's, with its token
        now = str(Hlc(time.time_ns() // 1_000_000, 0, "late"))
        request = encode_request([b"SET", key, b"61.0"])
        return bytes(line.store.store.handle("agent-a", request, now, former).reply.payload)

    # The token of its last write of the key (it moves on with every renewal of the lease).
    former = [e.token for e in line.store_events if e.key == key and e.accepted][-1]
    # The takeover fences the key: a write of it by the new active, accepted.
    line.wait_store_event(lambda e: e.key == key and e.accepted and "-b-" in e.client, timeout=30)
    answer = line.background.call(late_write)
    assert b"lower version than the fencing token" in answer, answer


@pytest.mark.parametrize(
    ("point", "value", "reason"),
    [
        (
            "coolSetPoint",
            "20.5",
            "the cooling set point 20.5 must be at least 1 above the heating set point 20",
        ),
        (
            "heatSetPoint",
            "23.5",
            "the cooling set point 24 must be at least 1 above the heating set point 23.5",
        ),
    ],
)
def test_a_value_against_the_deadband_is_refused_with_why_and_the_key_restored(
    line: PointsRig, point: str, value: str, reason: str
) -> None:
    line.start_active("a")
    line.wait_points(every_point(1, AT_START))
    refused = command(line, "setpoint", "set", "t01", value, "--point", point, "--wait", "10")
    assert refused.returncode == EXIT_REFUSED, (refused.stdout, refused.stderr)
    assert f"refused: {reason}" in refused.stderr
    # Not left in the store as if it held, nor written to the unit.
    line.wait_points({(1, point): AT_START[point]})
    assert line.point_writes(1, point) == []
    raw = line.store_value("t01\\synced")
    assert raw is not None
    assert json.loads(raw)["refused"] == {
        "point": point,
        "value": value,
        "version": json.loads(raw)["refused"]["version"],
        "reason": reason,
    }
    # A value that keeps the deadband still goes through after it.
    done = command(
        line, "setpoint", "set", "t01", "26.0", "--point", "coolSetPoint", "--wait", "10"
    )
    assert done.returncode == 0, done.stderr
    line.wait_units({(1, "coolSetPoint"): 26.0})


def test_a_write_left_unanswered_is_never_taken_for_a_panel_change(line: PointsRig) -> None:
    """A unit slow to answer writes takes the write and answers late: the agent gives up on
    the answer, the write stays pending. A remote change that arrived while the write
    waited its turn must be decided on a reading taken after that write, not on the one
    taken just before it (which still shows the value the write replaced): deciding on that
    one recorded the old value, dropped the write from those pending, and left the unit
    holding the write over the newer remote change."""
    agent, _ = line.start_active(
        "a",
        AGENT_SERIAL__POLL_INTERVAL_S="600",
        AGENT_SERIAL__MIN_WRITE_INTERVAL_S="2",
        # A change the agent could not read the unit for is retried by the safety net, or
        # once the unit, quarantined after the late reply, answers a probe again.
        AGENT_RECONCILE_INTERVAL_S="2",
        AGENT_SERIAL__PROBE_INTERVAL_S="1",
    )
    line.wait_points(every_point(1, AT_START))
    line.remote_point(1, "setPoint", 21.0)  # a write now: the next one waits its interval
    agent.wait_for_new(re.compile(r"t01.*applied remote set point 21\.0"))
    line.background.call(lambda: line.unit(1).fault("SLOWWRITE", 1500))
    reads = line.background.call(lambda: line.device.counters.requests)
    line.remote_point(1, "occupied", False)
    # Its reading taken (the write now waits for the interval), a newer remote change.
    line.wait_line(lambda fake: fake.counters.requests > reads)
    line.remote_point(1, "occupied", True)
    agent.wait_for_new(re.compile(r"t01.*could not apply occupied False"))
    line.background.call(lambda: line.unit(1).fault("CLEAR"))
    line.wait_units({(1, "occupied"): True})
    line.wait_points({(1, "occupied"): True})
    agent.drain()
    assert not any(re.search(r"published occupied False", x) for x in agent.lines)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # Raised, heat's key first: heat 25 beside the unit's cool 24 broke the deadband
        # alone; with cool 27 it keeps it, and cool goes to the unit first.
        (
            [("heatSetPoint", 25.0), ("coolSetPoint", 27.0)],
            {"heatSetPoint": 25.0, "coolSetPoint": 27.0},
        ),
        # Lowered, cool's key first: cool 19.5 beside the unit's heat 20 broke it alone.
        (
            [("coolSetPoint", 19.5), ("heatSetPoint", 15.0)],
            {"heatSetPoint": 15.0, "coolSetPoint": 19.5},
        ),
        # A pair that breaks the deadband itself: both refused, neither half applied.
        (
            [("heatSetPoint", 25.0), ("coolSetPoint", 25.5)],
            {"heatSetPoint": 20.0, "coolSetPoint": 24.0},
        ),
    ],
    ids=["raised", "lowered", "breaking"],
)
def test_both_set_points_changed_in_one_burst_are_judged_as_one_change(
    line: PointsRig, changes: list[tuple[str, float]], expected: dict[str, float]
) -> None:
    line.start_active("a")
    line.wait_points(every_point(1, AT_START))
    for name, value in changes:
        assert line.remote_point(1, name, value) == b"+OK\r\n"
    line.wait_units({(1, name): value for name, value in expected.items()})
    line.wait_points({(1, name): value for name, value in expected.items()})
    if expected["heatSetPoint"] == AT_START["heatSetPoint"]:
        assert line.point_writes(1, "heatSetPoint") == line.point_writes(1, "coolSetPoint") == []
    else:
        assert line.point_writes(1, "heatSetPoint") == [expected["heatSetPoint"]]
        assert line.point_writes(1, "coolSetPoint") == [expected["coolSetPoint"]]


def test_setpoint_set_writes_several_points_of_a_device_in_one_command(line: PointsRig) -> None:
    line.start_active("a")
    line.wait_points(every_point(1, AT_START))
    done = command(
        line, "setpoint", "set", "t01", "heatSetPoint=25", "coolSetPoint=27", "--wait", "10"
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert [row.split()[0] for row in done.stdout.splitlines()] == ["heatSetPoint", "coolSetPoint"]
    line.wait_units({(1, "heatSetPoint"): 25.0, (1, "coolSetPoint"): 27.0})
    refused = command(
        line, "setpoint", "set", "t01", "heatSetPoint=29", "coolSetPoint=29.5", "--wait", "10"
    )
    assert refused.returncode == EXIT_REFUSED, (refused.stdout, refused.stderr)
    assert "refused: heatSetPoint: " in refused.stderr
    assert "refused: coolSetPoint: " in refused.stderr
    line.wait_points({(1, "heatSetPoint"): 25.0, (1, "coolSetPoint"): 27.0})
