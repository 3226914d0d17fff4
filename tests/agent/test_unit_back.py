"""A unit back from an absence (power-cycled on the fake line: silent, then at its factory
values) is given the store's values back, or has its own published as its line says, with a
warning and an entry in the line's history; also when it comes back during a failover."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ops.support import Topics, command, status, wait_change
from tests.support.processes import AgentProcess
from tests.support.rig import ACTIVE, LineRig

LINE = LineRig.LINE
RESTORED = re.compile(
    r"WARNING \[floor3/t02 (\w)\] agent: set point back after an absence with 20\.0, not the "
    r"synced 22\.5: the store's 22\.5 goes back to it \(after_absence store\)"
)
PUBLISHED = re.compile(
    r"WARNING \[floor3/t02 a\] agent: set point back after an absence with 20\.0, not the "
    r"synced 22\.5: the unit's value wins \(after_absence unit\)"
)


PROBED = {"AGENT_SERIAL__PROBE_INTERVAL_S": "0.5"}
"""A unit that left the line is asked again soon, not in 30 s."""


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[LineRig]:
    rig = LineRig(tmp_path, 3)
    try:
        yield rig
    finally:
        rig.close()


def set_22_5(rig: LineRig) -> None:
    assert rig.remote_set_device(2, b"22.5") == b"+OK\r\n"
    rig.wait_line(lambda line: line.unit(2).setpoint == 22.5)


def unplug(rig: LineRig) -> None:
    """t02's power goes: it is silent until plug_back()."""
    rig.background.call(lambda: rig.unit(2).fault("POWERCYCLE", 600))


def plug_back(rig: LineRig, seen_by: AgentProcess) -> None:
    """Once `seen_by` has seen t02 leave (however slow the machine: a power cycle of fixed
    length could end first), it comes back at its factory values."""
    seen_by.wait_for_new(re.compile(r"t02: not answering; quarantined"), timeout=15)
    rig.background.call(lambda: rig.unit(2).fault("CLEAR"))


def power_cycle(rig: LineRig, seen_by: AgentProcess) -> None:
    unplug(rig)
    plug_back(rig, seen_by)


def history(rig: LineRig) -> list[dict[str, str]]:
    rig.wait_key(f"{LINE}\\history", lambda raw: raw is not None and b"unit back" in raw)
    result = command(rig, "history", LINE, "--json")
    assert result.returncode == 0, result.stderr
    entries: list[dict[str, str]] = json.loads(result.stdout)["lines"][LINE]
    return [e for e in entries if e["event"] == "unit back"]


def test_a_power_cycled_unit_gets_the_stores_set_point_back(rig: LineRig) -> None:
    active, _ = rig.start_active("a", **PROBED)
    set_22_5(rig)
    power_cycle(rig, active)
    active.wait_for_new(RESTORED, timeout=15)
    rig.wait_line(lambda line: line.unit(2).reset_count == 1 and line.unit(2).setpoint == 22.5)
    assert rig.setpoint_in_store(2) == b"22.5"  # the factory 20.0 never published
    (entry,) = history(rig)
    assert entry["from"] == "t02" and "the store's 22.5 goes back to it" in entry["why"]
    active.drain()
    assert not [
        t for t in active.lines if "t02 a] agent: published set point 20.0 to the store (local" in t
    ]


def test_a_unit_whose_panel_is_the_master_has_its_values_published(rig: LineRig) -> None:
    statuses = Topics(rig.port, "devices/t02/status")
    try:
        active, _ = rig.start_active("a", AGENT_SERIAL__AFTER_ABSENCE="unit", **PROBED)
        set_22_5(rig)
        power_cycle(rig, active)
        active.wait_for_new(PUBLISHED, timeout=15)
        rig.wait_store({2: b"20.0"})
        (entry,) = history(rig)
        assert "the unit's value wins" in entry["why"]
        # agent status t02 says where its set point came from, once the active has said it.
        wait_change(statuses, "t02", "the unit's after an absence")
        _, document = status(rig, "t02")
        (row,) = [d for d in document["lines"][0]["devices"] if d["device"] == "t02"]
        assert row["changes"][0].startswith("setPoint 20.0: the unit's after an absence, ")
    finally:
        statuses.close()


def test_a_unit_back_during_a_failover_gets_the_stores_set_point_back(rig: LineRig) -> None:
    active, _ = rig.start_active("a", **PROBED)
    standby = rig.start_agent("b", **PROBED)
    set_22_5(rig)
    standby.wait_for(re.compile("started as standby"))
    # The active dies and the unit power-cycles: it is silent when the standby takes over,
    # back at its factory values after.
    unplug(rig)
    active.signal(signal.SIGKILL)
    standby.wait_for_new(ACTIVE, timeout=10)
    plug_back(rig, standby)
    found = standby.wait_for_new(RESTORED, timeout=20)
    assert found.group(1) == "b"
    rig.wait_line(lambda line: line.unit(2).reset_count == 1 and line.unit(2).setpoint == 22.5)
    assert rig.setpoint_in_store(2) == b"22.5"


def test_a_unit_the_former_active_saw_leave_is_restored_by_the_next_one(rig: LineRig) -> None:
    """The active sees the unit leave and dies; the unit is back, reset, before the standby
    takes over and reads it at once: the sync record says the unit was away."""
    active, _ = rig.start_active("a", **PROBED)
    standby = rig.start_agent("b", **PROBED)
    set_22_5(rig)
    standby.wait_for(re.compile("started as standby"))
    rig.background.call(lambda: rig.unit(2).fault("UNPLUG", 600))
    active.wait_for_new(re.compile(r"t02: not answering; quarantined"), timeout=15)
    rig.wait_key("t02\\synced", lambda raw: raw is not None and b'"away":true' in raw)
    active.signal(signal.SIGKILL)

    def back_reset() -> None:
        rig.unit(2).fault("CLEAR")
        rig.unit(2).reset()

    rig.background.call(back_reset)
    standby.wait_for_new(ACTIVE, timeout=10)
    assert standby.wait_for_new(RESTORED, timeout=20).group(1) == "b"
    rig.wait_line(lambda line: line.unit(2).setpoint == 22.5)
    assert rig.setpoint_in_store(2) == b"22.5"
    rig.wait_key("t02\\synced", lambda raw: raw is not None and b'"away"' not in raw)
