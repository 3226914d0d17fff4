"""The points of a thermostat the agent keeps in sync, each in its key `<device>\\<point>`:
what kind each is, its text in the store, and the rules a value must keep. Pure.

- `setPoint` (as always), `heatSetPoint`, `coolSetPoint`: °C, ASCII decimals in the store
  (`21.5`), within the unit's limits and on its step; the cooling set point at least the
  unit's least deadband above the heating one.
- `mode` (`off`, `heat`, `cool`, `auto`, `fan`) and `fan` (`auto`, `on`, `low`, `medium`,
  `high`): one of their choices, as that text.
- `occupied`: `true` or `false`.
- `temperature` (°C) and `humidity` (%): read only; in telemetry and status, and in the
  store only where a profile asks (with a deadband, so that a line of 32 does not flood it).

A unit without a profile has the set point alone, as before.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum

from agent.controller.interface import InvalidSetpoint, Limits, PointValue, validate_setpoint

__all__ = ["POINTS", "InvalidValue", "Kind", "Point", "PointValue"]


class Kind(StrEnum):
    NUMBER = "number"
    CHOICE = "choice"
    SWITCH = "switch"


@dataclass(frozen=True, slots=True)
class Point:
    name: str
    kind: Kind
    writable: bool
    choices: tuple[str, ...] = ()
    unit: str = ""


SET_POINT = Point("setPoint", Kind.NUMBER, True, unit="°C")
HEAT_SET_POINT = Point("heatSetPoint", Kind.NUMBER, True, unit="°C")
COOL_SET_POINT = Point("coolSetPoint", Kind.NUMBER, True, unit="°C")
MODE = Point("mode", Kind.CHOICE, True, ("off", "heat", "cool", "auto", "fan"))
FAN = Point("fan", Kind.CHOICE, True, ("auto", "on", "low", "medium", "high"))
OCCUPIED = Point("occupied", Kind.SWITCH, True)
TEMPERATURE = Point("temperature", Kind.NUMBER, False, unit="°C")
HUMIDITY = Point("humidity", Kind.NUMBER, False, unit="%")

POINTS: dict[str, Point] = {
    point.name: point
    for point in (
        SET_POINT,
        HEAT_SET_POINT,
        COOL_SET_POINT,
        MODE,
        FAN,
        OCCUPIED,
        TEMPERATURE,
        HUMIDITY,
    )
}
WRITABLE = tuple(name for name, point in POINTS.items() if point.writable)
READ_ONLY = tuple(name for name, point in POINTS.items() if not point.writable)
DEFAULT_DEADBAND = 1.0
"""°C between the heating and the cooling set point when a profile says nothing."""

_DECIMAL = re.compile(rb"-?[0-9]{1,4}(\.[0-9]{1,6})?")
_TOLERANCE = 1e-6
_SWITCH = {b"true": True, b"false": False}


class InvalidValue(ValueError):
    """A value a point cannot take: not of its kind, outside its limits, not a choice, or
    against the deadband. The message says why, for the log and the refusal record."""


def point(name: str) -> Point:
    try:
        return POINTS[name]
    except KeyError:
        raise KeyError(f"no point {name!r} (known: {', '.join(POINTS)})") from None


def encode(point: Point, value: PointValue) -> bytes:
    """The point's text in the store: `21.5`, `22.0`; `heat`; `true`."""
    if point.kind is Kind.SWITCH:
        return b"true" if value else b"false"
    if point.kind is Kind.CHOICE:
        return str(value).encode()
    assert isinstance(value, int | float) and not isinstance(value, bool)
    return number_text(value).encode()


def number_text(value: float) -> str:
    """A number as the store holds it, and as every view shows it beside the store's:
    at least one decimal and at most three (`20.0`, `21.5`, `0.125`), so that one value
    never reads `20.0` in one column and `20` in the next."""
    text = f"{value:.3f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def stored_number_text(raw: bytes) -> str | None:
    """A store value that is a decimal number, written as `number_text` writes it (`20`,
    `20.0` and `20.00` all read `20.0`); None for anything else."""
    return number_text(float(raw)) if _DECIMAL.fullmatch(raw) else None


def parse(point: Point, raw: bytes) -> PointValue:
    """A value of the point's kind from its text in the store (InvalidValue otherwise)."""
    if point.kind is Kind.SWITCH:
        if raw in _SWITCH:
            return _SWITCH[raw]
        raise InvalidValue(f"{point.name} is true or false, not {_shown(raw)}")
    if point.kind is Kind.CHOICE:
        text = raw.decode("ascii", errors="replace")
        if text in point.choices:
            return text
        raise InvalidValue(f"{point.name} is one of {', '.join(point.choices)}, not {_shown(raw)}")
    if not _DECIMAL.fullmatch(raw):
        raise InvalidValue(f"not a decimal number: {_shown(raw)}")
    return float(raw)


def same(a: PointValue | None, b: PointValue | None) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        return a == b
    return math.isclose(a, b, abs_tol=_TOLERANCE)


def validate(point: Point, value: PointValue, limits: Limits | None) -> PointValue:
    """The value to write for `value`: a number checked against `limits` and rounded to
    the step; a choice or a switch as it is (InvalidValue for anything else)."""
    if point.kind is Kind.NUMBER:
        if limits is None:
            raise InvalidValue(f"{point.name} has no limits to check {value!r} against")
        try:
            return validate_setpoint(value, limits)
        except InvalidSetpoint as exc:
            raise InvalidValue(_why_out_of_limits(point, value, limits, exc.reason)) from None
    if point.kind is Kind.CHOICE:
        if value not in point.choices:
            raise InvalidValue(f"{value!r} is not one of {', '.join(point.choices)}")
        return value
    if not isinstance(value, bool):
        raise InvalidValue(f"{point.name} is true or false, not {value!r}")
    return value


def _why_out_of_limits(point: Point, value: object, limits: Limits, reason: str) -> str:
    """Why a number was refused, as a person reads it: `99 is above the limit 35`."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if value > limits.max:
            return f"{_number(value)} is above the limit {_number(limits.max)}"
        if value < limits.min:
            return f"{_number(value)} is below the limit {_number(limits.min)}"
    return f"{point.name} {value!r}: {reason}"


def check_deadband(heat: float | None, cool: float | None, deadband: float) -> str | None:
    """Why a heating and a cooling set point cannot stand together, or None."""
    if heat is None or cool is None:
        return None
    if cool - heat < deadband - _TOLERANCE:
        return (
            f"the cooling set point {_number(cool)} must be at least {_number(deadband)} "
            f"above the heating set point {_number(heat)}"
        )
    return None


def _number(value: float) -> str:
    return f"{value:g}"


def _shown(raw: bytes) -> str:
    return repr(raw[:32].decode("ascii", errors="backslashreplace"))
