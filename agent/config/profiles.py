"""Profiles as configured: a model of thermostat described once, named by its devices.

They live in the devices file (``AGENT_DEVICES_FILE`` holding ``{"profiles": {...},
"devices": [...]}``) or in a file of their own (``AGENT_PROFILES_FILE``: ``{name: profile}``);
``sim``, the simulator's thermostat, is built in. One profile, in JSON::

    "kc-fcd2": {
      "protocol": "modbus",
      "deadband": 2.0,
      "points": {
        "setPoint":     {"register": 0, "limits": {"min": 5, "max": 35, "step": 0.5}},
        "temperature":  {"register": 1, "read": 4},
        "heatSetPoint": {"register": 2, "limits": {"min": 5, "max": 30, "step": 0.5}},
        "coolSetPoint": {"register": 3, "limits": {"min": 10, "max": 35, "step": 0.5}},
        "mode":         {"register": 4, "write": 16, "values": {"off": 0, "heat": 1, "cool": 2}},
        "occupied":     {"register": 5, "values": {"true": 1, "false": 0}},
        "humidity":     {"register": 6, "read": 4, "scale": 1, "signed": false,
                         "store_deadband": 5}
      }
    }

``deadband``: the least difference between cooling and heating set point (default 1.0);
``after_absence``: who wins when a unit comes back from an absence (unplugged, reset,
powered off, replaced) holding other values than those last synced, ``store`` (written back
to the unit) or ``unit`` (published; for units whose panel is the master); default: the
line's ``AGENT_SERIAL__AFTER_ABSENCE``, itself ``store``;
``max_gap`` (Modbus): the most registers no point has that one read may span between two
that one has (default 0: consecutive registers only, as many units refuse a read of a
register they lack). Per point: ``limits`` (a number the agent writes; the set point's
default 5..35 by 0.5), ``store_deadband`` (a read-only point in the store too, when it
moved this much). Modbus: ``register``, ``read`` (3 or 4, default 3), ``write`` (6 or 16,
default 6; null: read only), ``scale`` (default 10) and ``signed`` (default true) for a
number, ``values`` for a choice or a switch (a switch's default true 1, false 0). Line
protocol: ``name`` (one or two characters, the set point's SP) and for a choice ``tokens``
(default: its values in upper case).

Everything here is checked at start: a profile that makes no sense, a device naming a profile
that does not exist or one for the other protocol, is a setting error naming the profile and
the point (the agent exits 78).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.controller.interface import DEFAULT_LIMITS, Limits, PointValue
from agent.controller.line_profile import LinePoint, LineProfile
from agent.controller.modbus_profile import ModbusPoint, ModbusProfile
from agent.controller.points import DEFAULT_DEADBAND, POINTS, Kind
from agent.controller.profile import PointRules, Profile, check
from agent.controller.sim_profile import BUILT_IN

__all__ = [
    "BUILT_IN",
    "ProfileSettings",
    "parse_profiles",
    "read_devices_file",
    "read_profiles_file",
    "resolve",
]

Protocol = Literal["modbus", "line"]
_MODBUS_FIELDS = {
    "register_number": "register",
    "read": "read",
    "write": "write",
    "scale": "scale",
    "signed": "signed",
    "values": "values",
}
_LINE_FIELDS = {"name": "name", "tokens": "tokens"}


class LimitsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min: float
    max: float
    step: Annotated[float, Field(gt=0)]


class PointSettings(BaseModel):
    """One point of a profile: its rules, and how its protocol keeps it."""

    model_config = ConfigDict(extra="forbid")

    limits: LimitsSettings | None = None
    store_deadband: Annotated[float, Field(ge=0)] | None = None
    register_number: Annotated[int, Field(ge=0, le=65535)] | None = Field(
        default=None, alias="register"
    )
    read: Literal[3, 4] = 3
    write: Literal[6, 16] | None = 6
    scale: Annotated[float, Field(gt=0)] | None = None
    signed: bool | None = None
    values: dict[str, Annotated[int, Field(ge=0, le=65535)]] | None = None
    name: str | None = None
    tokens: dict[str, str] | None = None


class ProfileSettings(BaseModel):
    """A profile as configured."""

    model_config = ConfigDict(extra="forbid")

    protocol: Protocol
    deadband: Annotated[float, Field(ge=0)] = DEFAULT_DEADBAND
    max_gap: Annotated[int, Field(ge=0, le=15)] = 0
    after_absence: Literal["store", "unit"] | None = None
    points: dict[str, PointSettings]


def parse_profiles(data: object) -> dict[str, Profile]:
    """The profiles in a JSON object {name: profile}; ValueError naming the profile and the
    point for one that makes no sense."""
    if not isinstance(data, dict):
        raise ValueError("profiles: expected an object of profiles by name")
    profiles: dict[str, Profile] = {}
    for name, raw in data.items():
        if name in BUILT_IN:
            raise ValueError(f"profile {name}: the name of a built-in profile")
        profiles[name] = build(name, raw)
    return profiles


def read_profiles_file(path: Path) -> dict[str, Profile]:
    """The profiles in the file AGENT_PROFILES_FILE: {name: profile}, or {"profiles": ...}."""
    data = _json(path.read_text())
    if isinstance(data, dict) and set(data) == {"profiles"}:
        data = data["profiles"]
    return parse_profiles(data)


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None


def build(name: str, raw: object) -> Profile:
    """One profile from its JSON; ValueError naming it (and the point) if it makes no sense."""
    try:
        settings = ProfileSettings.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(_validation_error(name, exc)) from None
    if settings.protocol == "line" and "max_gap" in settings.model_fields_set:
        raise ValueError(f"profile {name}: max_gap is for a profile of Modbus")
    rules: dict[str, PointRules] = {}
    maps: dict[str, Any] = {}
    for point, spec in settings.points.items():
        where = f"profile {name}, point {point}"
        if point not in POINTS:
            raise ValueError(f"{where}: no such point (known: {', '.join(POINTS)})")
        try:
            rules[point] = _rules(point, spec)
            maps[point] = _protocol_point(point, spec, settings.protocol)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    try:
        if settings.protocol == "modbus":
            modbus, line = ModbusProfile(maps, settings.max_gap), None
        else:
            modbus, line = None, LineProfile(maps)
    except ValueError as exc:
        raise ValueError(
            f"profile {name}, {exc}" if str(exc).startswith("point ") else f"profile {name}: {exc}"
        ) from None
    profile = Profile(
        name,
        rules,
        settings.deadband,
        modbus=modbus,
        line=line,
        after_absence=settings.after_absence,
    )
    check(profile)
    return profile


def _rules(point: str, spec: PointSettings) -> PointRules:
    limits: Limits | None = None
    if spec.limits is not None:
        limits = Limits(spec.limits.min, spec.limits.max, spec.limits.step)
    elif point == "setPoint":
        limits = DEFAULT_LIMITS
    return PointRules(limits, spec.store_deadband)


def _protocol_point(point: str, spec: PointSettings, protocol: Protocol) -> ModbusPoint | LinePoint:
    given = spec.model_fields_set
    other = _LINE_FIELDS if protocol == "modbus" else _MODBUS_FIELDS
    stray = [shown for field, shown in other.items() if field in given]
    if stray:
        speaks = "Modbus" if protocol == "modbus" else "the line protocol"
        raise ValueError(f"{stray[0]} is not for a profile of {speaks}")
    known = POINTS[point]
    if protocol == "line":
        if spec.name is None:
            raise ValueError("give its name on the line (name: one or two characters)")
        return LinePoint(spec.name, spec.tokens or {})
    if spec.register_number is None:
        raise ValueError("give its register")
    if known.kind is not Kind.NUMBER and ({"scale", "signed"} & given):
        raise ValueError("scale and signed are for numbers (a choice or a switch has values)")
    write = spec.write if ("write" in given or known.writable) else None
    return ModbusPoint(
        spec.register_number,
        read_function=spec.read,
        write_function=write,
        scale=10.0 if spec.scale is None else spec.scale,
        signed=True if spec.signed is None else spec.signed,
        values=_values(point, spec.values),
    )


def _values(point: str, given: Mapping[str, int] | None) -> dict[PointValue, int]:
    if given is None:
        return {}
    values: dict[PointValue, int] = {}
    if POINTS[point].kind is not Kind.SWITCH:
        values.update(given)
        return values
    for text, raw in given.items():
        if text not in ("true", "false"):
            raise ValueError(f"values: {text!r} is not true or false")
        values[text == "true"] = raw
    return values


def _validation_error(name: str, exc: ValidationError) -> str:
    error = exc.errors()[0]
    location = [str(part) for part in error["loc"]]
    message = error["msg"].removeprefix("Value error, ")
    if len(location) >= 2 and location[0] == "points":
        field = ".".join(location[2:])
        return f"profile {name}, point {location[1]}: {field + ': ' if field else ''}{message}"
    return f"profile {name}: {'.'.join(location) or 'profile'}: {message}"


def resolve(
    devices: Iterable[tuple[str, str | None]], profiles: Mapping[str, Profile], driver: Protocol
) -> dict[str, Profile]:
    """Each device's profile, by device id, for the (device id, profile name) given; the
    devices without one have none. ValueError for a name not defined or a profile the line's
    driver does not speak."""
    resolved: dict[str, Profile] = {}
    speaks = "Modbus" if driver == "modbus" else "the line protocol"
    for device, name in devices:
        if name is None:
            continue
        profile = profiles.get(name)
        if profile is None:
            raise ValueError(
                f"device {device}: no profile {name!r} (defined: {', '.join(sorted(profiles))})"
            )
        if (profile.modbus if driver == "modbus" else profile.line) is None:
            raise ValueError(
                f"device {device}: the profile {name} is not for {speaks}, which this line "
                f"speaks (AGENT_SERIAL__DRIVER={driver})"
            )
        resolved[device] = profile
    return resolved


def read_devices_file(text: str) -> tuple[object, dict[str, Profile]]:
    """The devices (as parse_devices takes them) and the profiles in the text of a devices
    file: a list of devices (or id@address,...), or {"profiles": {...}, "devices": [...]}."""
    if not text.lstrip().startswith("{"):
        return text, {}
    data = _json(text)
    assert isinstance(data, dict)
    unknown = sorted(set(data) - {"profiles", "devices"})
    if unknown:
        raise ValueError(f"{unknown[0]!r}: a devices file holds devices and profiles only")
    if "devices" not in data:
        raise ValueError('no "devices": the list of devices on the line')
    return data["devices"], parse_profiles(data.get("profiles", {}))
