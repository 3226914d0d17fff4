"""The controller's ASCII line protocol (see the shared controller-protocol contract).

Pure: framing with the NMEA-style XOR checksum, formatting and parsing of requests and
replies, and splitting a byte stream into lines. No I/O; both the serial driver and the
fake device are thin wrappers around this module.

A unit with a profile (agent.controller.line_profile) also has its points: `GET POINTS`
reads them all at once (`POINTS SP=21.5 H=20.0 M=HEAT ...`), and `SET <name> <value>`
writes one (`OK <name> <value>`, the value as stored), `<name>` being the point's name in
the profile (`SP` is the set point's, as always).
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Collection
from dataclasses import dataclass

from agent.controller.interface import ControllerState, Limits, Mode

MAX_LINE = 80
"""Longest line in bytes, CR LF included."""

TERMINATOR = b"\r\n"

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_CHECKSUMMED = re.compile(rb"(.*)\*([0-9A-Fa-f]{2})")
_PRINTABLE = frozenset(range(0x20, 0x7F))
_ALL_PRINTABLE = re.compile(rb"[\x20-\x7e]*")


class ProtocolError(ValueError):
    """A line that breaks the protocol."""


class FramingError(ProtocolError):
    """Not a well-formed line: not printable ASCII, too long, a stray '*'."""


class ChecksumError(FramingError):
    """The checksum is wrong, or missing where one is required."""


class RequestError(ProtocolError):
    """A request the device cannot serve; `code` is what it answers after ERR."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# --- framing ---------------------------------------------------------------------------


def checksum(data: bytes) -> int:
    """XOR of all bytes, as in NMEA 0183."""
    return functools.reduce(operator.xor, data, 0)


# The codec's functions of a line are memoised (bounded): a line polls the same units with
# the same requests, and their replies repeat while a unit's reading holds still, so a
# transaction's encoding and decoding is done once per distinct line, not per poll. (What
# they return is immutable; what they raise is not kept.)
CODEC_MEMO = 1024


@dataclass(frozen=True, slots=True)
class Frame:
    """The payload of one line, and whether it carried a (valid) checksum."""

    payload: str
    checksummed: bool


@functools.lru_cache(maxsize=CODEC_MEMO)
def encode_line(payload: str, *, with_checksum: bool = True) -> bytes:
    """The bytes on the wire for `payload`: `payload*HH\\r\\n` (or without `*HH`)."""
    data = payload.encode("ascii")
    if not _ALL_PRINTABLE.fullmatch(data) or b"*" in data:
        raise FramingError(f"payload must be printable ASCII without '*': {payload!r}")
    if with_checksum:
        data += b"*%02X" % checksum(data)
    line = data + TERMINATOR
    if len(line) > MAX_LINE:
        raise FramingError(f"line of {len(line)} bytes is over {MAX_LINE}: {payload!r}")
    return line


def decode_line(line: bytes, *, require_checksum: bool) -> Frame:
    """The frame in one received line (terminator optional); raises FramingError."""
    content = line.rstrip(b"\r\n")
    if len(content) + len(TERMINATOR) > MAX_LINE:
        raise FramingError(f"line of {len(content)} bytes is too long")
    if not _ALL_PRINTABLE.fullmatch(content):
        raise FramingError(f"line is not printable ASCII: {content!r}")
    match = _CHECKSUMMED.fullmatch(content)
    if match is None:
        if b"*" in content:
            raise FramingError(f"malformed checksum: {content!r}")
        if require_checksum:
            raise ChecksumError(f"checksum missing: {content!r}")
        return Frame(content.decode("ascii"), checksummed=False)
    data, given = match.group(1), int(match.group(2), 16)
    if b"*" in data:
        raise FramingError(f"malformed checksum: {content!r}")
    if checksum(data) != given:
        raise ChecksumError(
            f"checksum wrong: {content!r} (computed {checksum(data):02X}, got {given:02X})"
        )
    return Frame(data.decode("ascii"), checksummed=True)


def salvage_reply(line: bytes) -> Frame | None:
    """The checksummed reply in a received line, discarding stray bytes in front of it.

    Returns None if the line holds only noise (control bytes, blanks). Raises
    ChecksumError or FramingError if it holds text but no valid checksummed frame:
    that is a corrupted reply, not noise.
    """
    return _salvage_reply(bytes(line))  # (a bytearray is no memo's key)


@functools.lru_cache(maxsize=CODEC_MEMO)
def _salvage_reply(line: bytes) -> Frame | None:
    content = line.rstrip(b"\r\n")
    # A reply starts with an upper-case keyword or an address prefix (@); try each such
    # position, earliest first, so that a prefix of line noise is skipped. The checksum
    # makes a false match unlikely.
    for start, byte in enumerate(content):
        if 0x41 <= byte <= 0x5A or byte == 0x40:
            try:
                return decode_line(content[start:], require_checksum=True)
            except FramingError:
                continue
    # No valid frame: what follows the last control byte is what the device meant to
    # send, with its noise stripped; judge that.
    tail = content
    for index in range(len(content) - 1, -1, -1):
        if content[index] not in _PRINTABLE:
            tail = content[index + 1 :]
            break
    if not tail.strip():
        return None
    return decode_line(tail[-(MAX_LINE - len(TERMINATOR)) :], require_checksum=True)


class LineSplitter:
    """Splits a byte stream into lines at LF. Pure and incremental.

    feed() returns complete lines without their CR LF; a line longer than `max_line`
    is returned as None (its bytes are dropped), so that a flood without line feeds
    cannot grow the buffer without bound.
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._buffer = bytearray()
        self._overlong = False

    def feed(self, data: bytes) -> list[bytes | None]:
        lines: list[bytes | None] = []
        self._buffer += data
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(self._buffer[:end]).rstrip(b"\r")
            del self._buffer[: end + 1]
            if self._overlong or end + 1 > self.max_line:
                lines.append(None)
            else:
                lines.append(line)
            self._overlong = False
        if len(self._buffer) >= self.max_line:
            self._overlong = True
            self._buffer.clear()
        return lines

    @property
    def pending(self) -> bytes:
        """Bytes received since the last line feed."""
        return bytes(self._buffer)

    def clear(self) -> None:
        self._buffer.clear()
        self._overlong = False


# --- addresses (multi-drop lines) -------------------------------------------------------

MIN_ADDRESS = 1
MAX_ADDRESS = 247
_ADDRESS_PREFIX = re.compile(r"@([0-9]+) ")


def with_address(address: int | None, payload: str) -> str:
    """`@<n> payload` for the device at address n; the payload alone point to point."""
    if address is None:
        return payload
    check_address(address)
    return f"@{address} {payload}"


@functools.lru_cache(maxsize=CODEC_MEMO)
def split_address(payload: str) -> tuple[int | None, str]:
    """(address, rest) of a payload: (None, payload) when it has no `@<n> ` prefix.

    Raises ProtocolError for a prefix that is malformed or out of range.
    """
    if not payload.startswith("@"):
        return None, payload
    match = _ADDRESS_PREFIX.match(payload)
    if match is None:
        raise ProtocolError(f"malformed address prefix: {payload!r}")
    address = int(match.group(1))
    if not MIN_ADDRESS <= address <= MAX_ADDRESS or match.group(1).startswith("0"):
        raise ProtocolError(f"address out of range {MIN_ADDRESS}..{MAX_ADDRESS}: {payload!r}")
    return address, payload[match.end() :]


def check_address(address: int) -> int:
    if not MIN_ADDRESS <= address <= MAX_ADDRESS:
        raise ValueError(f"address {address} is out of range {MIN_ADDRESS}..{MAX_ADDRESS}")
    return address


def parse_addresses(text: str) -> list[int]:
    """Addresses as a person lists them: `1-10,40,200-247` (ranges inclusive), in order,
    each once. ValueError saying what is wrong."""
    chosen: dict[int, None] = {}
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            shown = part.strip()
            raise ValueError(f"{shown!r} is not an address or a range such as 1-247") from None
        if first > last:
            raise ValueError(f"{part.strip()!r}: the range ends before it starts")
        for address in range(check_address(first), check_address(last) + 1):
            chosen[address] = None
    return list(chosen)


# --- numbers ---------------------------------------------------------------------------


def format_number(value: float) -> str:
    """At least one decimal and at most three: 21.5, 5.0, 0.05. Never -0.0."""
    text = f"{value:.3f}".rstrip("0")
    if text.endswith("."):
        text += "0"
    return "0.0" if text == "-0.0" else text


def parse_number(text: str) -> float:
    """A plain decimal number; no exponent, nan or inf."""
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"not a decimal number: {text!r}")
    return float(text)


# --- requests --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identify:
    pass


@dataclass(frozen=True, slots=True)
class GetSetpoint:
    pass


@dataclass(frozen=True, slots=True)
class SetSetpoint:
    value: float


@dataclass(frozen=True, slots=True)
class GetTemperature:
    pass


@dataclass(frozen=True, slots=True)
class GetState:
    pass


@dataclass(frozen=True, slots=True)
class GetLimits:
    pass


@dataclass(frozen=True, slots=True)
class GetPoints:
    """`GET POINTS`: every point of a unit with a profile, in one reply."""


@dataclass(frozen=True, slots=True)
class SetValue:
    """`SET <name> <value>`: one point of a unit with a profile (the set point is SET SP)."""

    name: str
    value: str


Request = (
    Identify
    | GetSetpoint
    | SetSetpoint
    | GetTemperature
    | GetState
    | GetLimits
    | GetPoints
    | SetValue
)

_SIMPLE_REQUESTS: dict[tuple[str, ...], Request] = {
    ("ID",): Identify(),
    ("GET", "SP"): GetSetpoint(),
    ("GET", "T"): GetTemperature(),
    ("GET", "STATE"): GetState(),
    ("GET", "LIMITS"): GetLimits(),
    ("GET", "POINTS"): GetPoints(),
}
_GET_TARGETS = frozenset({"SP", "T", "STATE", "LIMITS", "POINTS"})


@functools.lru_cache(maxsize=CODEC_MEMO)
def format_request(request: Request) -> str:
    if isinstance(request, SetSetpoint):
        return f"SET SP {format_number(request.value)}"
    if isinstance(request, SetValue):
        return f"SET {request.name} {request.value}"
    for words, simple in _SIMPLE_REQUESTS.items():
        if simple == request:
            return " ".join(words)
    raise TypeError(f"not a request: {request!r}")  # pragma: no cover - exhaustive above


def parse_request(payload: str, names: Collection[str] = ()) -> Request:
    """The request in a payload; raises RequestError with code SYNTAX or UNKNOWN.

    Command words are case-insensitive, for people typing at the panel. `names` are the
    points (besides SP) that `SET <name> <value>` may write, in upper case: the device's.
    """
    words = payload.split()
    if not words:
        raise RequestError("SYNTAX", "empty request")
    upper = tuple(word.upper() for word in words)
    if upper in _SIMPLE_REQUESTS:
        return _SIMPLE_REQUESTS[upper]
    if upper[:2] == ("SET", "SP"):
        if len(words) != 3:
            raise RequestError("SYNTAX", "SET SP takes one value")
        try:
            return SetSetpoint(parse_number(words[2]))
        except ValueError as exc:
            raise RequestError("SYNTAX", str(exc)) from exc
    if upper[0] == "SET" and len(upper) > 1 and upper[1] in names:
        if len(words) != 3:
            raise RequestError("SYNTAX", f"SET {upper[1]} takes one value")
        return SetValue(upper[1], upper[2])
    if upper[0] == "ID" or (upper[0] == "GET" and len(upper) > 1 and upper[1] in _GET_TARGETS):
        raise RequestError("SYNTAX", f"unexpected arguments: {payload!r}")
    if upper[0] in ("GET", "SET"):
        raise RequestError("SYNTAX" if len(upper) == 1 else "UNKNOWN", f"unknown: {payload!r}")
    raise RequestError("UNKNOWN", f"unknown command: {payload!r}")


# --- replies ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IdReply:
    model: str
    firmware: str
    serial: str


@dataclass(frozen=True, slots=True)
class SetpointReply:
    value: float


@dataclass(frozen=True, slots=True)
class SetpointStored:
    """`OK SP <value>`: the set point as stored, rounded to the step."""

    value: float


@dataclass(frozen=True, slots=True)
class TemperatureReply:
    value: float


@dataclass(frozen=True, slots=True)
class StateReply:
    state: ControllerState


@dataclass(frozen=True, slots=True)
class LimitsReply:
    limits: Limits


@dataclass(frozen=True, slots=True)
class PointsReply:
    """`POINTS <name>=<value> ...`: a unit's points, by their names in its profile."""

    fields: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class ValueStored:
    """`OK <name> <value>`: a point as the unit stored it (the set point's is OK SP)."""

    name: str
    value: str


@dataclass(frozen=True, slots=True)
class OkReply:
    """A bare `OK` (the panel's answer to its own commands)."""


@dataclass(frozen=True, slots=True)
class ErrorReply:
    code: str
    args: tuple[str, ...] = ()

    def __str__(self) -> str:
        return " ".join(("ERR", self.code, *self.args))


Reply = (
    IdReply
    | SetpointReply
    | SetpointStored
    | TemperatureReply
    | StateReply
    | LimitsReply
    | PointsReply
    | ValueStored
    | OkReply
    | ErrorReply
)


def format_reply(reply: Reply) -> str:
    match reply:
        case IdReply(model, firmware, serial):
            return f"ID {model} {firmware} {serial}"
        case SetpointReply(value):
            return f"SP {format_number(value)}"
        case SetpointStored(value):
            return f"OK SP {format_number(value)}"
        case TemperatureReply(value):
            return f"T {format_number(value)}"
        case StateReply(state):
            if state.output is None or state.mode is None:
                raise ValueError("the line protocol reports output and mode")
            return (
                f"STATE SP={format_number(state.setpoint)} T={format_number(state.temperature)}"
                f" OUT={state.output} MODE={state.mode.value}"
            )
        case LimitsReply(limits):
            return (
                f"LIMITS {format_number(limits.min)} {format_number(limits.max)}"
                f" {format_number(limits.step)}"
            )
        case PointsReply(fields):
            return " ".join(["POINTS", *(f"{name}={value}" for name, value in fields)])
        case ValueStored(name, value):
            return f"OK {name} {value}"
        case OkReply():
            return "OK"
        case ErrorReply():
            return str(reply)
    raise TypeError(f"not a reply: {reply!r}")  # pragma: no cover - exhaustive above


def _number(text: str, what: str) -> float:
    try:
        return parse_number(text)
    except ValueError as exc:
        raise ProtocolError(f"{what}: {exc}") from exc


def _parse_state(fields: list[str]) -> ControllerState:
    values: dict[str, str] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or key in values:
            raise ProtocolError(f"bad STATE field {field!r}")
        values[key] = value
    if set(values) != {"SP", "T", "OUT", "MODE"}:
        raise ProtocolError(f"STATE needs SP, T, OUT and MODE, got {sorted(values)}")
    output = _number(values["OUT"], "OUT")
    if not output.is_integer() or not 0 <= output <= 100:
        raise ProtocolError(f"OUT must be an integer 0..100, not {values['OUT']!r}")
    try:
        mode = Mode(values["MODE"])
    except ValueError as exc:
        raise ProtocolError(f"unknown MODE {values['MODE']!r}") from exc
    return ControllerState(
        setpoint=_number(values["SP"], "SP"),
        temperature=_number(values["T"], "T"),
        output=int(output),
        mode=mode,
    )


def _parse_points(fields: list[str]) -> PointsReply:
    pairs: list[tuple[str, str]] = []
    for field in fields:
        name, sep, value = field.partition("=")
        if not sep or not name or not value or any(name == seen for seen, _ in pairs):
            raise ProtocolError(f"bad POINTS field {field!r}")
        pairs.append((name, value))
    if not pairs:
        raise ProtocolError("POINTS without a point")
    return PointsReply(tuple(pairs))


@functools.lru_cache(maxsize=CODEC_MEMO)
def parse_reply(payload: str) -> Reply:
    """The reply in a payload; raises ProtocolError for anything unexpected."""
    words = payload.split()
    if not words:
        raise ProtocolError("empty reply")
    head, rest = words[0], words[1:]
    match head, rest:
        case "ID", [model, firmware, serial]:
            return IdReply(model, firmware, serial)
        case "SP", [value]:
            return SetpointReply(_number(value, "SP"))
        case "OK", []:
            return OkReply()
        case "OK", ["SP", value]:
            return SetpointStored(_number(value, "OK SP"))
        case "OK", [name, value]:
            return ValueStored(name, value)
        case "POINTS", fields:
            return _parse_points(fields)
        case "T", [value]:
            return TemperatureReply(_number(value, "T"))
        case "STATE", fields:
            return StateReply(_parse_state(fields))
        case "LIMITS", [low, high, step]:
            try:
                limits = Limits(
                    _number(low, "LIMITS"), _number(high, "LIMITS"), _number(step, "LIMITS")
                )
            except ValueError as exc:
                raise ProtocolError(str(exc)) from exc
            return LimitsReply(limits)
        case "ERR", [code, *args]:
            return ErrorReply(code, tuple(args))
    raise ProtocolError(f"unexpected reply {payload!r}")
