"""What the bytes on a fake line mean: the ASCII line protocol, or Modbus RTU.

A wire splits a client's byte stream into requests, parses each once for all the units,
lets the addressed unit answer, and says how a reply is damaged and how many bits a
character takes on the line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from agent.controller import line_protocol as lp
from agent.controller.line_profile import LineProfile
from agent.controller.modbus_map import RegisterMap
from agent.controller.modbus_profile import ModbusProfile
from agent.simulator.core import (
    ASCII_BITS_PER_CHAR,
    RTU_BITS_PER_CHAR,
    TEXT_DAMAGE,
    DeviceCore,
    ReplyDamage,
    TextRequest,
    parse_text_request,
)
from agent.simulator.rtu import (
    RTU_DAMAGE,
    RegisterView,
    RtuRequest,
    RtuSplitter,
    parse_rtu_request,
    written_number,
)


class Unit(Protocol):
    """What a wire needs of the unit that answers (`line.Unit` is one)."""

    @property
    def core(self) -> DeviceCore: ...

    @property
    def registers(self) -> RegisterView | None: ...


class Splitter(Protocol):
    def feed(self, data: bytes) -> list[bytes | None]: ...


class Incoming(Protocol):
    """A request parsed once, before the units look at it."""

    @property
    def address(self) -> int | None: ...

    @property
    def kind(self) -> str: ...

    @property
    def value(self) -> float | None: ...

    @property
    def point(self) -> str | None:
        """The point a write stores."""


class Wire(Protocol):
    """What the bytes on the line mean: the line protocol or Modbus RTU."""

    bits_per_char: int
    damage: ReplyDamage

    def splitter(self) -> Splitter: ...

    def parse(self, frame: bytes | None) -> Incoming | None: ...

    def request_size(self, frame: bytes | None) -> int: ...

    def answer(self, unit: Unit, request: Any, now: float, channel: str) -> bytes: ...


class TextWire:
    """The ASCII line protocol, the units' points named by `points` (their profile's)."""

    bits_per_char = ASCII_BITS_PER_CHAR
    damage: ReplyDamage = TEXT_DAMAGE

    def __init__(self, points: LineProfile | None = None) -> None:
        self.points = points

    def splitter(self) -> Splitter:
        return lp.LineSplitter()

    def parse(self, frame: bytes | None) -> TextRequest | None:
        if self.points is None:
            return parse_text_request(frame)
        return parse_text_request(frame, self.points)

    def request_size(self, frame: bytes | None) -> int:
        return len(frame if frame is not None else b"") + len(lp.TERMINATOR)

    def answer(self, unit: Unit, request: TextRequest, now: float, channel: str) -> bytes:
        return unit.core.answer_text(request, now, channel)


@dataclass(frozen=True, slots=True)
class _RtuIncoming:
    request: RtuRequest
    value: float | None
    point: str | None

    @property
    def address(self) -> int | None:
        return self.request.address

    @property
    def kind(self) -> str:
        return self.request.kind


class RtuWire:
    """Modbus RTU, every unit with the same register map (at its own unit id) and the same
    profile's registers (`points`)."""

    bits_per_char = RTU_BITS_PER_CHAR
    damage: ReplyDamage = RTU_DAMAGE

    def __init__(self, register_map: RegisterMap, points: ModbusProfile | None = None) -> None:
        self.map = register_map
        self.points = points

    def splitter(self) -> Splitter:
        return RtuSplitter()

    def parse(self, frame: bytes | None) -> _RtuIncoming | None:
        if frame is None:
            return None
        request = parse_rtu_request(frame)
        point, value = written_number(self.map, self.points, request)
        return _RtuIncoming(request, value, point)

    def request_size(self, frame: bytes | None) -> int:
        return len(frame or b"")

    def answer(self, unit: Unit, request: _RtuIncoming, now: float, channel: str) -> bytes:
        assert unit.registers is not None
        return unit.registers.answer(request.request, now, channel)
