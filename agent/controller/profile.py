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

from agent.controller.interface import DEFAULT_LIMITS, Limits
from agent.controller.line_profile import LineProfile
from agent.controller.modbus_profile import ModbusProfile, encode_number
from agent.controller.points import DEFAULT_DEADBAND, POINTS, InvalidValue, Kind


@dataclass(frozen=True, slots=True)
class PointRules:
    limits: Limits | None = None
    """For a number the agent writes: the values the unit takes (min, max, step)."""
    store_deadband: float | None = None
    """For a read-only point: in the store too, when it moved this much since it was last
    published (None: in telemetry and status only)."""


AFTER_ABSENCE = ("store", "unit")
"""Who may win when a unit comes back from an absence with values other than those synced."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    points: Mapping[str, PointRules]
    deadband: float = DEFAULT_DEADBAND
    """The least difference between the cooling and the heating set point."""
    modbus: ModbusProfile | None = None
    """How a Modbus unit keeps the points (the drivers' and the simulator's)."""
    line: LineProfile | None = None
    """How a unit speaking the line protocol keeps them."""
    after_absence: str | None = None
    """Who wins when a unit comes back from an absence (unplugged, reset, powered off,
    replaced) holding other values: "store" (its values are written back to the unit) or
    "unit" (the unit's are published); None: the line's setting (serial.after_absence)."""

    def __post_init__(self) -> None:
        unknown = set(self.points) - set(POINTS)
        if unknown:
            raise ValueError(f"profile {self.name}: unknown points {sorted(unknown)}")
        if "setPoint" not in self.points:
            raise ValueError(f"profile {self.name}: every profile has the setPoint")
        if self.after_absence not in (None, *AFTER_ABSENCE):
            raise ValueError(f"profile {self.name}: after_absence is store or unit")

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


def check(profile: Profile) -> None:
    """ValueError, naming the profile and the point, for a profile that makes no sense
    beyond its protocol maps' own checks: a protocol map that does not cover exactly its
    points, no temperature to read, a number the agent writes without limits (or limits
    its registers cannot hold), a store deadband on a point the agent writes, a deadband
    the heating and cooling limits cannot keep."""
    where = f"profile {profile.name}"
    if not profile.deadband >= 0:
        raise ValueError(f"{where}: the deadband {profile.deadband} is below 0")
    if profile.modbus is None and profile.line is None:
        raise ValueError(f"{where}: it says how neither Modbus nor the line protocol keep it")
    if "temperature" not in profile.points:
        raise ValueError(f"{where}, point temperature: every profile reads the temperature")
    for protocol, mapped in (("Modbus", profile.modbus), ("line protocol", profile.line)):
        if mapped is None:
            continue
        for name in profile.points:
            if name not in mapped.points:
                raise ValueError(f"{where}, point {name}: the {protocol} map does not say how")
        for name in mapped.points:
            if name not in profile.points:
                raise ValueError(f"{where}, point {name}: in the {protocol} map, not a point")
    for name, rules in profile.points.items():
        known = POINTS[name]
        writes = known.writable and known.kind is Kind.NUMBER
        if writes and rules.limits is None:
            raise ValueError(f"{where}, point {name}: the agent writes it: give its limits")
        if rules.limits is not None and known.kind is not Kind.NUMBER:
            raise ValueError(f"{where}, point {name}: only a number has limits")
        if rules.store_deadband is not None:
            if known.writable:
                raise ValueError(
                    f"{where}, point {name}: a store deadband is for read-only points (the "
                    "agent keeps a point it writes in the store always)"
                )
            if not rules.store_deadband >= 0:
                raise ValueError(f"{where}, point {name}: the store deadband is below 0")
        if profile.modbus is not None and rules.limits is not None:
            spec = profile.modbus.points[name]
            for limit in (rules.limits.min, rules.limits.max):
                try:
                    encode_number(limit, spec.scale, spec.signed, "its limit")
                except InvalidValue as exc:
                    raise ValueError(f"{where}, point {name}: {exc}") from None
    heat, cool = profile.limits("heatSetPoint"), profile.limits("coolSetPoint")
    if heat is not None and cool is not None and cool.max - heat.min < profile.deadband:
        raise ValueError(
            f"{where}, point coolSetPoint: its limits leave no cooling set point "
            f"{profile.deadband:g} above a heating one"
        )
