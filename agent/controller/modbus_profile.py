"""How a Modbus unit keeps a profile's points: pure data and pure functions, shared by the
Modbus driver and the simulator's Modbus units.

Per point: its register (a protocol address, 0-based), the function that reads it (3,
holding; 4, input), the one that writes it (6, write single register; 16, write multiple;
None: the protocol cannot write it), and how its value sits in the register: a number v as
round(v * scale), a 16-bit two's complement integer if signed; a choice (`mode`, `fan`) or a
switch (`occupied`) as the register value its map gives each of its values.

The points are read together: registers of one read function that follow each other, within
MAX_SPAN of the first, in one request (`reads`), so a unit whose points are close costs one
poll. A read spans registers no point has only where the profile allows (`max_gap`): many
units refuse a read of a register they do not have (exception 2, an illegal data address).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

from agent.controller.interface import PointValue
from agent.controller.modbus_map import MAX_SPAN
from agent.controller.modbus_rtu import READ_HOLDING, READ_INPUT, WRITE_MULTIPLE, WRITE_SINGLE
from agent.controller.points import POINTS, InvalidValue, Kind

__all__ = [
    "MAX_SPAN",
    "ModbusPoint",
    "ModbusProfile",
    "plan_reads",
    "read_reply_bytes",
    "read_request_bytes",
]

SWITCH_VALUES: Mapping[PointValue, int] = {True: 1, False: 0}
"""A switch's register values when its map says nothing: 1 on, 0 off."""


def read_request_bytes() -> int:
    """A read request: unit, function, first register, count, CRC."""
    return 8


def read_reply_bytes(count: int) -> int:
    """The reply to a read of `count` registers."""
    return 5 + 2 * count


@dataclass(frozen=True, slots=True)
class ModbusPoint:
    """Where a unit keeps one point, and how."""

    register: int
    read_function: int = READ_HOLDING
    """3 (holding registers) or 4 (input registers)."""
    write_function: int | None = WRITE_SINGLE
    """6 (write single register), 16 (write multiple registers), or None: read only."""
    scale: float = 10.0
    """For a number: the register holds round(value * scale)."""
    signed: bool = True
    """For a number: a 16-bit two's complement integer."""
    values: Mapping[PointValue, int] = field(default_factory=dict)
    """For a choice or a switch: the register value of each of the point's values (a
    switch's default: true 1, false 0). A choice may map some of its values only."""

    def __post_init__(self) -> None:
        if not 0 <= self.register <= 0xFFFF:
            raise ValueError(f"register {self.register} is not 0..65535")
        if self.read_function not in (READ_HOLDING, READ_INPUT):
            raise ValueError(f"read function {self.read_function} is not 3 or 4")
        if self.write_function not in (WRITE_SINGLE, WRITE_MULTIPLE, None):
            raise ValueError(f"write function {self.write_function} is not 6 or 16")
        if isinstance(self.scale, bool) or not self.scale > 0 or self.scale == float("inf"):
            raise ValueError(f"scale {self.scale} is not a positive number")
        for value, raw in self.values.items():
            if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 0xFFFF:
                raise ValueError(f"the register value {raw!r} of {value!r} is not 0..65535")


@dataclass(frozen=True, slots=True)
class ModbusProfile:
    """A profile's points as a Modbus unit keeps them. ValueError at construction, naming
    the point, for a map that makes no sense: an unknown point, a value its point does not
    have, two values in one register value, registers that overlap, a point the agent
    writes without a write function (or a read-only one with one)."""

    points: Mapping[str, ModbusPoint]
    max_gap: int = 0
    """The most registers that no point has a read may span between two that one has (0:
    a read of consecutive registers only)."""
    _to_value: dict[str, dict[int, PointValue]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_gap, bool) or not 0 <= self.max_gap < MAX_SPAN:
            raise ValueError(f"max_gap {self.max_gap} is not 0..{MAX_SPAN - 1}")
        to_value: dict[str, dict[int, PointValue]] = {}
        slots: dict[tuple[str, int], str] = {}
        for name, spec in self.points.items():
            known = POINTS.get(name)
            if known is None:
                raise ValueError(f"point {name}: no such point (known: {', '.join(POINTS)})")
            values = _values(name, spec)
            if values:
                to_value[name] = {raw: value for value, raw in values.items()}
            if known.writable and spec.write_function is None:
                raise ValueError(
                    f"point {name}: the agent writes it, but it has no write function (6 or 16)"
                )
            if not known.writable and spec.write_function is not None:
                raise ValueError(f"point {name}: it is read only, so it has no write function")
            taken = {("input" if spec.read_function == READ_INPUT else "holding", spec.register)}
            if spec.write_function is not None:
                taken.add(("holding", spec.register))
            for slot in sorted(taken):
                other = slots.get(slot)
                if other is not None:
                    raise ValueError(f"point {name}: {slot[0]} register {slot[1]} is {other}'s too")
                slots[slot] = name
        object.__setattr__(self, "_to_value", to_value)

    def point(self, name: str) -> ModbusPoint:
        try:
            return self.points[name]
        except KeyError:
            raise KeyError(f"the profile's Modbus map has no point {name}") from None

    def choices(self, name: str) -> tuple[PointValue, ...]:
        """The values of a choice or a switch that the unit can take (its map's)."""
        return tuple(_values(name, self.point(name)))

    def reads(self) -> list[tuple[int, int, int]]:
        """The reads (function, first register, count) that fetch every point: one where
        the registers allow."""
        return plan_reads(
            ((spec.read_function, spec.register) for spec in self.points.values()), self.max_gap
        )

    def poll_frames(self) -> list[tuple[int, int]]:
        """Bytes of each read's request and reply."""
        return [(read_request_bytes(), read_reply_bytes(count)) for _, _, count in self.reads()]

    def encode(self, name: str, value: PointValue) -> int:
        """The register value for a point's value; InvalidValue if it has none."""
        spec = self.point(name)
        kind = POINTS[name].kind
        if kind is Kind.NUMBER:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidValue(f"{name} is a number, not {value!r}")
            return encode_number(value, spec.scale, spec.signed, name)
        for known, raw in _values(name, spec).items():
            if known == value and isinstance(known, bool) == isinstance(value, bool):
                return raw
        raise InvalidValue(
            f"the unit cannot take {name} {_shown(value)} (its map has no value for it)"
        )

    def decode(self, name: str, raw: int) -> PointValue:
        """A point's value from its register; InvalidValue for a register value the map
        does not give."""
        spec = self.point(name)
        if POINTS[name].kind is Kind.NUMBER:
            return decode_number(raw, spec.scale, spec.signed)
        try:
            return self._to_value[name][raw]
        except KeyError:
            raise InvalidValue(
                f"{name}'s register {spec.register} holds {raw}, which its map does not give"
            ) from None

    def decode_all(self, registers: Mapping[tuple[int, int], int]) -> dict[str, PointValue]:
        """Every point's value from the registers read, by (function, register)."""
        return {
            name: self.decode(name, registers[(spec.read_function, spec.register)])
            for name, spec in self.points.items()
        }


def _values(name: str, spec: ModbusPoint) -> Mapping[PointValue, int]:
    """A choice's or a switch's map, checked (ValueError naming the point)."""
    known = POINTS[name]
    if known.kind is Kind.NUMBER:
        if spec.values:
            raise ValueError(f"point {name}: a number has no map of values")
        return {}
    values = spec.values or (SWITCH_VALUES if known.kind is Kind.SWITCH else {})
    if not values:
        raise ValueError(f"point {name}: give the register value of each of its values")
    seen: dict[int, PointValue] = {}
    for value, raw in values.items():
        if known.kind is Kind.SWITCH:
            if not isinstance(value, bool):
                raise ValueError(f"point {name}: {value!r} is not true or false")
        elif not isinstance(value, str) or value not in known.choices:
            raise ValueError(f"point {name}: {value!r} is not one of {', '.join(known.choices)}")
        if raw in seen:
            raise ValueError(
                f"point {name}: {_shown(seen[raw])} and {_shown(value)} both have the "
                f"register value {raw}"
            )
        seen[raw] = value
    if known.kind is Kind.SWITCH and set(values) != {True, False}:
        raise ValueError(f"point {name}: give the register values of both true and false")
    return values


def plan_reads(
    registers: Iterable[tuple[int, int]], max_gap: int = 0
) -> list[tuple[int, int, int]]:
    """Group (function, register) pairs into reads (function, first, count): registers of one
    function at most `max_gap` apart (registers between them that are not wanted), within
    MAX_SPAN of the read's first."""
    pairs = set(registers)
    reads: list[tuple[int, int, int]] = []
    for function in sorted({f for f, _ in pairs}):
        wanted = sorted(r for f, r in pairs if f == function)
        start = previous = wanted[0]
        for register in wanted[1:]:
            if register - previous - 1 > max_gap or register - start >= MAX_SPAN:
                reads.append((function, start, previous - start + 1))
                start = register
            previous = register
        reads.append((function, start, previous - start + 1))
    return reads


def encode_number(value: float, scale: float, signed: bool, name: str = "value") -> int:
    """round(value * scale) as a 16-bit register; InvalidValue if it does not fit."""
    scaled = (_decimal(value) * _decimal(scale)).to_integral_value(ROUND_HALF_UP)
    low, high = (-0x8000, 0x7FFF) if signed else (0, 0xFFFF)
    if not low <= scaled <= high:
        kind = "signed" if signed else "unsigned"
        raise InvalidValue(f"{name} {value:g} does not fit a register at scale {scale:g}, {kind}")
    return int(scaled) & 0xFFFF


def decode_number(raw: int, scale: float, signed: bool) -> float:
    if signed and raw >= 0x8000:
        raw -= 0x10000
    return float(Decimal(raw) / _decimal(scale))


def _decimal(value: float) -> Decimal:
    return Decimal(repr(value))


def _shown(value: PointValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
