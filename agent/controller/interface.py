"""What the agent sees of its local controller, whatever the driver behind it.

Pure: data types, exceptions and set point validation. No I/O.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal, InvalidOperation
from enum import StrEnum
from fractions import Fraction
from types import TracebackType
from typing import Self


class Mode(StrEnum):
    """What the controller's output is doing."""

    HEAT = "HEAT"
    COOL = "COOL"
    IDLE = "IDLE"


@dataclass(frozen=True, slots=True)
class Limits:
    """The set points a controller accepts: min..max in steps of `step` from min."""

    min: float
    max: float
    step: float

    def __post_init__(self) -> None:
        for name in ("min", "max", "step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"limit {name} must be a number, not {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"limit {name} must be finite, not {value!r}")
        if self.min > self.max:
            raise ValueError(f"limits: min {self.min} is above max {self.max}")
        if self.step <= 0:
            raise ValueError(f"limits: step must be positive, not {self.step}")


DEFAULT_LIMITS = Limits(5.0, 35.0, 0.5)


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    model: str
    firmware: str
    serial: str


PointValue = float | str | bool
"""A point's value: a number (°C, %), a choice (`heat`), or a switch (`occupied`)."""


@dataclass(frozen=True, slots=True)
class ControllerState:
    """One reading of the controller.

    `output` (percent) and `mode` (what the output does) are None when the driver cannot
    read them (a Modbus register map without those registers). `points` holds the unit's
    other points, by name (agent.controller.points), when it has a profile that has them.
    """

    setpoint: float
    temperature: float
    output: int | None
    mode: Mode | None
    points: Mapping[str, PointValue] = field(default_factory=dict)

    def value(self, name: str) -> PointValue | None:
        """A point's value in this reading (None: not read)."""
        if name == "setPoint":
            return self.setpoint
        if name == "temperature" and "temperature" not in self.points:
            return self.temperature
        return self.points.get(name)


class ControllerFault(Exception):
    """Base of the faults a driver reports; a driver raises nothing else at run time."""


class ControllerUnavailable(ControllerFault):
    """The controller cannot be reached: port gone, being reopened, or no reply in time."""


class ControllerError(ControllerFault):
    """The controller answered, but refused the request or answered nonsense."""


class SetpointRejected(ControllerError):
    """The controller refused the set point (its limits may have changed)."""


class WriteNotAllowed(ControllerError):
    """Nothing was written: the caller's `allowed` check or the line's gate said no at the
    last moment (and the subclasses below)."""


class Superseded(WriteNotAllowed):
    """A newer write to the same unit took this one's place before it went out."""


class ReadingChanged(WriteNotAllowed):
    """The unit no longer holds the set point the write was decided on (a panel change,
    say): nothing was written; `state` is the newest reading, to decide again."""

    def __init__(self, message: str, state: ControllerState | None) -> None:
        super().__init__(message)
        self.state = state


class NotSent(ControllerUnavailable):
    """Refused before a byte went out: the unit is quarantined, the line is down or closed."""


class NotReadBeforeWrite(NotSent):
    """The read that guards a write went unanswered (or failed): the write was not sent."""


class InvalidSetpoint(ValueError):
    """A set point that is not a finite number within the limits. Nothing was written."""

    def __init__(self, value: object, reason: str) -> None:
        super().__init__(f"invalid set point {value!r}: {reason}")
        self.value = value
        self.reason = reason


def _decimal(value: float | int | Decimal | Fraction) -> Decimal:
    # repr() of a float is the shortest string that reads back to it, so 21.15 stays
    # 21.15 and rounds half-up as a person expects, not as its binary value would.
    if isinstance(value, Decimal):
        return value
    if isinstance(value, Fraction):
        return Decimal(value.numerator) / Decimal(value.denominator)
    return Decimal(repr(value))


def as_finite_number(value: object) -> float:
    """`value` as a float if it is a finite real number (not a bool, not a string)."""
    if isinstance(value, bool):
        raise InvalidSetpoint(value, "a boolean is not a temperature")
    if not isinstance(value, int | float | Decimal | Fraction):
        raise InvalidSetpoint(value, f"not a number ({type(value).__name__})")
    try:
        if isinstance(value, Decimal) and not value.is_finite():
            raise InvalidSetpoint(value, "not a finite number")
        number = float(value)
    except (OverflowError, InvalidOperation) as exc:
        raise InvalidSetpoint(value, "not a finite number") from exc
    if not math.isfinite(number):
        raise InvalidSetpoint(value, "not a finite number")
    return number


def round_to_step(value: float, limits: Limits) -> float:
    """The nearest value on the grid min, min+step, ... (halves up), kept within max."""
    lo, hi, step = _decimal(limits.min), _decimal(limits.max), _decimal(limits.step)
    steps = ((_decimal(value) - lo) / step).to_integral_value(rounding=ROUND_HALF_UP)
    # max need not lie on the grid: never round past either end of it.
    last = ((hi - lo) / step).to_integral_value(rounding=ROUND_FLOOR)
    result = lo + min(max(steps, Decimal(0)), last) * step
    return float(result)


def validate_setpoint(value: object, limits: Limits) -> float:
    """The set point to write for `value`: checked against `limits` and rounded to the step.

    Raises InvalidSetpoint for anything that is not a finite real number within
    limits.min..limits.max (bools and strings are not numbers here).
    """
    number = as_finite_number(value)
    if number < limits.min or number > limits.max:
        raise InvalidSetpoint(value, f"outside the limits {limits.min}..{limits.max}")
    return round_to_step(number, limits)


AvailabilityCallback = Callable[[bool], None]


class Controller(ABC):
    """The async interface the agent uses to talk to its controller.

    Use as `async with driver:` or call open()/close(). Every method raises
    ControllerUnavailable or ControllerError for device faults (InvalidSetpoint for a
    bad value) and never anything else: a driver never crashes its caller.
    """

    @property
    @abstractmethod
    def available(self) -> bool:
        """True while the controller answers; False while it is gone or being reopened."""

    @property
    @abstractmethod
    def limits(self) -> Limits | None:
        """The limits last read (None: read them before a write)."""

    @property
    @abstractmethod
    def last_state(self) -> ControllerState | None:
        """The newest reading (its set point updated by writes)."""

    @property
    @abstractmethod
    def last_state_at(self) -> float | None:
        """When (monotonic) the newest reading ended on the wire."""

    @property
    @abstractmethod
    def last_write_at(self) -> float | None:
        """When (monotonic) the last write ended on the wire, answered or not."""

    @abstractmethod
    async def open(self) -> None:
        """Open the port. If the controller is not there, keep retrying in the background."""

    @abstractmethod
    async def close(self) -> None:
        """Close the port and stop retrying."""

    @abstractmethod
    async def read_state(self) -> ControllerState:
        """Set point, temperature, output and mode."""

    @abstractmethod
    async def read_limits(self) -> Limits:
        """The set points the controller accepts."""

    @abstractmethod
    async def write_setpoint(
        self,
        value: object,
        *,
        allowed: Callable[[], bool] | None = None,
        expected: float | None = None,
        fresh_after: float | None = None,
    ) -> float:
        """Validate, round to the step, write, and return the value read back.

        `allowed`, when given, is asked right before writing; False means write nothing.
        `expected`, when given, is the set point the write was decided on: a controller
        that no longer holds it is not written (ReadingChanged, with the new reading); it
        is read right before the write unless its newest reading was taken after
        `fresh_after` (monotonic) by the transaction just before.
        """

    async def write_point(
        self,
        point: str,
        value: PointValue,
        *,
        allowed: Callable[[], bool] | None = None,
        expected: PointValue | None = None,
        fresh_after: float | None = None,
    ) -> PointValue:
        """`write_setpoint` for any point the unit has (agent.controller.points)."""
        if point != "setPoint":
            raise ControllerError(f"this controller has no point {point}")
        return await self.write_setpoint(
            value,
            allowed=allowed,
            expected=None if expected is None else float(expected),
            fresh_after=fresh_after,
        )

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
