"""Why a value written to the store is not applied yet, pure: read from the line's status
(agent.ops.view), for `agent setpoint set --wait`. The value stays in the store, and the
active applies it once what holds it back ends: the command says what that is, with an exit
code of its own, rather than only that the time is up."""

from __future__ import annotations

from dataclasses import dataclass

from agent.ops.view import Report

EXIT_NO_ACTIVE = 1
"""Nobody holds the line's lock (as `agent status`)."""
EXIT_PAUSED = 6
"""The line is paused (as `agent status`)."""
EXIT_DOWN = 8
"""The unit does not answer, the line is closed, or the active does not run."""


@dataclass(frozen=True, slots=True)
class Pending:
    code: int
    why: str
    """What holds the value back, and when it is applied."""


def why_pending(report: Report, device: str) -> Pending | None:
    """What keeps `device`'s value from being applied, or None when nothing seen does (the
    active is busy, or slow)."""
    line = report.line
    if report.holder is None:
        return Pending(
            EXIT_NO_ACTIVE,
            f"nobody is active on line {line} (nobody holds its lock): the value is in the "
            "store, and is applied when an agent of the line takes it over",
        )
    if report.paused is not None:
        return Pending(
            EXIT_PAUSED,
            f"line {line} is paused ({report.paused.describe()}): the value is in the store, "
            f"and is applied when the line is resumed (agent resume {line})",
        )
    active = report.instances[0] if report.instances else None
    if active is not None and (not active.up or active.state == "failing"):
        said = "is not responding" if not active.up else "is failing"
        problem = f": {active.problem}" if active.up and active.problem else ""
        return Pending(
            EXIT_DOWN,
            f"the active {report.holder} {said}{problem}: the value is in the store, and is "
            "applied when it runs again or the standby takes over",
        )
    row = next((d for d in report.devices if d.device == device), None)
    if row is not None and row.problem == "not answering":
        return Pending(
            EXIT_DOWN,
            f"{device} is not answering on line {line} (the unit or its wiring is down): the "
            "value is in the store, and is applied when the unit answers again",
        )
    return None
