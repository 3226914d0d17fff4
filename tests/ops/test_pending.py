"""Why a value written is not applied yet (`agent setpoint set --wait`), pure: from what
`agent status` makes of a line, with an exit code of its own for each reason."""

from __future__ import annotations

from agent.ops import view
from agent.ops.control import PauseNote
from agent.ops.pending import EXIT_DOWN, EXIT_NO_ACTIVE, EXIT_PAUSED, why_pending
from tests.ops.test_view import NOW, device_status, healthy


def test_nothing_holds_a_value_back_on_a_healthy_line() -> None:
    assert why_pending(view.assess(healthy(), NOW), "t01") is None


def test_a_paused_line_says_by_whom_and_why_and_how_it_ends() -> None:
    snapshot = healthy()
    snapshot.paused = PauseNote("alice@gw1", "2027-01-15T08:00:00Z", "new wiring")
    pending = why_pending(view.assess(snapshot, NOW), "t01")
    assert pending is not None and pending.code == EXIT_PAUSED
    assert pending.why == (
        "line floor3 is paused (new wiring, by alice@gw1, at 2027-01-15T08:00:00Z): the value "
        "is in the store, and is applied when the line is resumed (agent resume floor3)"
    )


def test_a_unit_that_does_not_answer_is_down() -> None:
    snapshot = healthy()
    snapshot.devices["t02"].status = device_status("t02", availability="offline")
    report = view.assess(snapshot, NOW)
    assert why_pending(report, "t01") is None  # another unit's trouble is not this one's
    pending = why_pending(report, "t02")
    assert pending is not None and pending.code == EXIT_DOWN
    assert pending.why.startswith("t02 is not answering on line floor3")
    assert pending.why.endswith("and is applied when the unit answers again")


def test_an_active_whose_line_is_closed_is_down() -> None:
    snapshot = healthy()
    problem = "serial port /dev/agent/floor3 does not exist"
    snapshot.health["gw1"].update(state="failing", problem=problem)
    pending = why_pending(view.assess(snapshot, NOW), "t01")
    assert pending is not None and pending.code == EXIT_DOWN
    assert pending.why.startswith(f"the active gw1 is failing: {problem}: the value is in")


def test_a_silent_active_is_down() -> None:
    snapshot = healthy()
    snapshot.health["gw1"]["time"] = NOW - 60
    pending = why_pending(view.assess(snapshot, NOW), "t01")
    assert pending is not None and pending.code == EXIT_DOWN
    assert pending.why.startswith("the active gw1 is not responding")


def test_nobody_active() -> None:
    snapshot = healthy()
    snapshot.holder = snapshot.lock_version = None
    pending = why_pending(view.assess(snapshot, NOW), "t01")
    assert pending is not None and pending.code == EXIT_NO_ACTIVE
    assert pending.why.startswith("nobody is active on line floor3 (nobody holds its lock)")
    assert len({EXIT_DOWN, EXIT_NO_ACTIVE, EXIT_PAUSED, 0, 2, 3, 4, 5, 7}) == 9  # each its own
