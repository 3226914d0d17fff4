"""A Modbus controller's register map and how its registers are read: plain data and pure
functions, shared by the Modbus RTU driver and the simulator's Modbus units.

A value v is kept in a register as round(v * scale), as a 16-bit two's complement integer
if signed; register numbers are protocol addresses (0-based).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

from agent.controller.interface import (
    DEFAULT_LIMITS,
    ControllerError,
    InvalidSetpoint,
    Limits,
    Mode,
)
from agent.controller.modbus_rtu import (
    ILLEGAL_DATA_VALUE,
    READ_HOLDING,
    READ_INPUT,
    WRITE_MULTIPLE,
    WRITE_SINGLE,
)

__all__ = [
    "ILLEGAL_DATA_VALUE",
    "MAX_SPAN",
    "READ_HOLDING",
    "READ_INPUT",
    "WRITE_MULTIPLE",
    "WRITE_SINGLE",
    "RegisterMap",
    "plan_reads",
]

MAX_SPAN = 16
"""Registers up to this far apart are read in one request."""


@dataclass(frozen=True, slots=True)
class RegisterMap:
    """Where a controller keeps its values, and how they are encoded.

    A value v is stored as round(v * scale), as a 16-bit two's complement integer if
    `signed`. Limits are either fixed (`limits`) or read from three registers.
    Register numbers are protocol addresses (0-based).
    """

    unit_id: int = 1
    setpoint_register: int = 0
    temperature_register: int = 1
    output_register: int | None = None
    """Output in percent, unscaled."""
    mode_register: int | None = None
    mode_values: tuple[tuple[int, Mode], ...] = (
        (0, Mode.IDLE),
        (1, Mode.HEAT),
        (2, Mode.COOL),
    )
    limits: Limits | None = DEFAULT_LIMITS
    min_register: int | None = None
    max_register: int | None = None
    step_register: int | None = None
    scale: float = 10.0
    signed: bool = True
    read_function: int = READ_HOLDING
    """For the set point and limit registers: 3 (holding) or 4 (input)."""
    status_function: int = READ_HOLDING
    """For temperature, output and mode: 3 (holding) or 4 (input)."""
    write_function: int = WRITE_SINGLE
    """6 (write single register) or 16 (write multiple registers)."""
    _modes: dict[int, Mode] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.unit_id <= 247:
            raise ValueError(f"unit id must be 1..247, not {self.unit_id}")
        for name in (
            "setpoint_register",
            "temperature_register",
            "output_register",
            "mode_register",
            "min_register",
            "max_register",
            "step_register",
        ):
            register = getattr(self, name)
            if register is not None and not 0 <= register <= 0xFFFF:
                raise ValueError(f"{name} must be 0..65535, not {register}")
        limit_registers = (self.min_register, self.max_register, self.step_register)
        if all(r is None for r in limit_registers):
            if self.limits is None:
                raise ValueError("give fixed limits or min, max and step registers")
        elif any(r is None for r in limit_registers) or self.limits is not None:
            raise ValueError("limits: give either fixed limits or all three registers")
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, not {self.scale}")
        for name in ("read_function", "status_function"):
            if getattr(self, name) not in (READ_HOLDING, READ_INPUT):
                raise ValueError(f"{name} must be 3 or 4, not {getattr(self, name)}")
        if self.write_function not in (WRITE_SINGLE, WRITE_MULTIPLE):
            raise ValueError(f"write_function must be 6 or 16, not {self.write_function}")
        object.__setattr__(self, "_modes", dict(self.mode_values))

    def mode_for(self, raw: int) -> Mode:
        try:
            return self._modes[raw]
        except KeyError:
            raise ControllerError(f"unknown mode value {raw}") from None

    def raw_for_mode(self, mode: Mode) -> int:
        return next(raw for raw, known in self.mode_values if known is mode)

    def decode(self, raw: int) -> float:
        """The value of a register."""
        if self.signed and raw >= 0x8000:
            raw -= 0x10000
        return float(Decimal(raw) / _decimal(self.scale))

    def encode(self, value: float) -> int:
        """The register for a value; InvalidSetpoint if 16 bits cannot hold it."""
        scaled = (_decimal(value) * _decimal(self.scale)).to_integral_value(ROUND_HALF_UP)
        low, high = (-0x8000, 0x7FFF) if self.signed else (0, 0xFFFF)
        if not low <= scaled <= high:
            raise InvalidSetpoint(value, f"does not fit a register at scale {self.scale}")
        return int(scaled) & 0xFFFF


@functools.lru_cache(maxsize=256)
def _decimal(value: float) -> Decimal:
    # A register's scale is asked for every value read: made once.
    return Decimal(repr(value))


def plan_reads(registers: Iterable[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Group (function, register) pairs into reads (function, first, count), joining
    registers of one function that lie close together."""
    pairs = set(registers)
    reads: list[tuple[int, int, int]] = []
    for function in sorted({f for f, _ in pairs}):
        wanted = sorted(r for f, r in pairs if f == function)
        start = wanted[0]
        for previous, register in zip(wanted, [*wanted[1:], None], strict=True):
            if register is None or register - start >= MAX_SPAN:
                reads.append((function, start, previous - start + 1))
                if register is not None:
                    start = register
    return reads
