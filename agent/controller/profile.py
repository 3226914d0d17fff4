"""A profile: a model of thermostat described once and used by many units. Pure data.

What the sync needs of it is here: the unit's points (the set point always among them),
the limits and step of each number it may write, the least deadband between the heating
and the cooling set point, and which read-only points also go to the store (and when: on a
change of at least their deadband). How each point is read and written is the protocol's
part of the profile (`modbus` or `line`), which only the drivers and the simulator read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.controller.interface import DEFAULT_LIMITS, Limits
from agent.controller.points import DEFAULT_DEADBAND, POINTS


@dataclass(frozen=True, slots=True)
class PointRules:
    limits: Limits | None = None
    """For a number the agent writes: the values the unit takes (min, max, step)."""
    store_deadband: float | None = None
    """For a read-only point: in the store too, when it moved this much since it was last
    published (None: in telemetry and status only)."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    points: Mapping[str, PointRules]
    deadband: float = DEFAULT_DEADBAND
    """The least difference between the cooling and the heating set point."""
    modbus: Any = None
    """How a Modbus unit keeps the points (the drivers' and the simulator's)."""
    line: Any = None
    """How a unit speaking the line protocol keeps them."""

    def __post_init__(self) -> None:
        unknown = set(self.points) - set(POINTS)
        if unknown:
            raise ValueError(f"profile {self.name}: unknown points {sorted(unknown)}")
        if "setPoint" not in self.points:
            raise ValueError(f"profile {self.name}: every profile has the setPoint")

    @property
    def writable(self) -> tuple[str, ...]:
        return tuple(name for name in self.points if POINTS[name].writable)

    def limits(self, point: str) -> Limits | None:
        rules = self.points.get(point)
        return None if rules is None else rules.limits


SET_POINT_ONLY = Profile("set point", {"setPoint": PointRules(DEFAULT_LIMITS)})
"""A unit without a profile: the set point alone, as before profiles."""


def rules(**points: PointRules) -> dict[str, PointRules]:
    """`rules(setPoint=PointRules(...), mode=PointRules())`, for profiles built in code."""
    return dict(points)


