"""The fake controller's pure core: what one unit answers in the line protocol, the faults
in force on a unit or on the whole line, the front panel's commands, and line times.

No I/O; times are passed in. `line` puts units on a line, `endpoints` on the wire.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Protocol, TypeVar

from agent.controller import line_protocol as lp
from agent.controller.interface import (
    DEFAULT_LIMITS,
    ControllerState,
    DeviceIdentity,
    Limits,
    round_to_step,
)
from agent.simulator.thermal_model import ThermalModel

DEFAULT_IDENTITY = DeviceIdentity("SIM-TSTAT", "1.0.0", "SIM0001")
STRAY_NOISE = b"\x00\xff\x13 \r\n\xfe~#"
"""Line noise: a line of control bytes, then a printable prefix on the reply's line."""

DEFAULT_RECORD_LIMIT = 10_000
"""How many records of each kind (requests on the line, writes of a unit) are kept."""

ASCII_BITS_PER_CHAR = 10
"""8N1: a start bit, eight data bits, a stop bit."""
RTU_BITS_PER_CHAR = 11
"""Modbus RTU: a start bit, eight data bits, parity (or a second stop bit), a stop bit."""

NO_ADDRESS = 0
"""The address of a request whose `@` prefix is malformed or out of range: no unit has it."""

T = TypeVar("T")

_HAS_CHECKSUM = re.compile(rb".*\*[0-9A-Fa-f]{2}")
_PREFIX = re.compile(rb"@([1-9][0-9]{0,2}) ")
_FRAME = re.compile(rb"([\x20-\x29\x2b-\x7e]*)(?:\*([0-9A-Fa-f]{2}))?")
"""A printable line without '*' (its text), then an optional checksum."""


def line_time_s(n_bytes: int, baud: int, bits_per_char: int = ASCII_BITS_PER_CHAR) -> float:
    """How long n bytes take on a serial line at `baud`."""
    return n_bytes * bits_per_char / baud


def append_bounded(records: list[T], record: T, limit: int) -> None:
    """Append, dropping the oldest record once `limit` are kept."""
    if len(records) >= limit:
        del records[: len(records) - limit + 1]
    records.append(record)


@dataclass(frozen=True, slots=True)
class WriteRecord:
    """A SET SP the device received (on its line, or PANEL SP at the panel)."""

    at: float
    """time.monotonic() at the device when it processed the request."""
    value: float
    stored: float | None
    """The value stored, rounded to the step; None if refused (out of range)."""
    channel: str


# --- requests as a device on the line sees them ---------------------------------------

_KINDS: dict[type[lp.Request], str] = {
    lp.Identify: "ID",
    lp.GetSetpoint: "GET SP",
    lp.SetSetpoint: "SET SP",
    lp.GetTemperature: "GET T",
    lp.GetState: "GET STATE",
    lp.GetLimits: "GET LIMITS",
}
INVALID = "INVALID"
"""The kind of a request that is not one: bad framing, checksum or command."""


@dataclass(frozen=True, slots=True)
class TextRequest:
    """One request line, parsed once for every device on the line."""

    address: int | None
    """The `@<n>` prefix's n; None without a prefix; NO_ADDRESS if it is malformed."""
    kind: str
    """ID, GET SP, SET SP, GET T, GET STATE, GET LIMITS, or INVALID."""
    value: float | None
    """The value of a SET SP."""
    request: lp.Request | None
    error: str | None
    """The code of the ERR reply the addressed device sends, when not a request."""
    checksummed: bool


def parse_text_request(line: bytes | None) -> TextRequest | None:
    """The request in a received line (None: a line too long to keep); None if blank.

    The same judgement as line_protocol.decode_line, in one pass: the fake parses every
    request on the line.
    """
    if line is None:
        return TextRequest(None, INVALID, None, None, "SYNTAX", checksummed=False)
    content = line.rstrip(b"\r\n")
    if not content.strip():
        return None
    address: int | None = None
    skip = 0
    if content[:1] == b"@":
        prefix = _PREFIX.match(content)
        if prefix is None or int(prefix.group(1)) > lp.MAX_ADDRESS:
            checksummed = _HAS_CHECKSUM.fullmatch(content) is not None
            return TextRequest(NO_ADDRESS, INVALID, None, None, "SYNTAX", checksummed)
        address, skip = int(prefix.group(1)), prefix.end()
    frame = _FRAME.fullmatch(content) if len(content) + len(lp.TERMINATOR) <= lp.MAX_LINE else None
    if frame is None:  # not printable, too long, or a stray '*'
        checksummed = _HAS_CHECKSUM.fullmatch(content) is not None
        return TextRequest(address, INVALID, None, None, "SYNTAX", checksummed)
    text, given = frame.groups()
    checksummed = given is not None
    if checksummed and lp.checksum(text) != int(given, 16):
        return TextRequest(address, INVALID, None, None, "CHECKSUM", checksummed=True)
    try:
        request = lp.parse_request(text[skip:].decode("ascii"))
    except lp.RequestError as exc:
        return TextRequest(address, INVALID, None, None, exc.code, checksummed)
    value = request.value if isinstance(request, lp.SetSetpoint) else None
    return TextRequest(address, _KINDS[type(request)], value, request, None, checksummed)


def decode_request(line: bytes) -> lp.Frame | bytes | None:
    """The frame of a request line, or the error reply to send, or None if blank."""
    content = line.rstrip(b"\r\n")
    if not content.strip():
        return None
    checksummed = _HAS_CHECKSUM.fullmatch(content) is not None
    try:
        return lp.decode_line(content, require_checksum=False)
    except lp.ChecksumError:
        return lp.encode_line("ERR CHECKSUM", with_checksum=True)
    except lp.FramingError:
        return lp.encode_line("ERR SYNTAX", with_checksum=checksummed)


# --- one device --------------------------------------------------------------------------


class DeviceCore:
    """What one fake controller answers, given the time. No I/O."""

    def __init__(
        self,
        *,
        now: float,
        setpoint: float = 20.0,
        temperature: float = 18.0,
        limits: Limits = DEFAULT_LIMITS,
        time_constant_s: float = 60.0,
        identity: DeviceIdentity = DEFAULT_IDENTITY,
        record_limit: int = DEFAULT_RECORD_LIMIT,
    ) -> None:
        self.limits = limits
        self.identity = identity
        self.record_limit = record_limit
        self.model = ThermalModel(
            setpoint=round_to_step(setpoint, limits),
            temperature=temperature,
            now=now,
            time_constant_s=time_constant_s,
        )
        self.writes: list[WriteRecord] = []
        """The last record_limit SET SP (or Modbus writes) received on the line."""
        self.panel_changes: list[WriteRecord] = []
        """The last record_limit PANEL SP."""

    def state(self, now: float) -> ControllerState:
        state = self.model.state(now)
        # The sensor resolves 0.1 °C.
        return ControllerState(
            setpoint=state.setpoint,
            temperature=round(state.temperature, 1),
            output=state.output,
            mode=state.mode,
        )

    def store_setpoint(self, value: float, now: float, channel: str) -> lp.Reply:
        """Store a set point (rounded to the step) or refuse it; record it as a write."""
        stored: float | None = None
        reply: lp.Reply
        if self.limits.min <= value <= self.limits.max:
            stored = round_to_step(value, self.limits)
            self.model.set_setpoint(stored, now)
            reply = lp.SetpointStored(stored)
        else:
            reply = lp.ErrorReply(
                "RANGE", (lp.format_number(self.limits.min), lp.format_number(self.limits.max))
            )
        record = WriteRecord(at=now, value=value, stored=stored, channel=channel)
        append_bounded(
            self.panel_changes if channel == "panel" else self.writes, record, self.record_limit
        )
        return reply

    def answer(self, request: lp.Request, now: float, channel: str) -> lp.Reply:
        match request:
            case lp.Identify():
                ident = self.identity
                return lp.IdReply(ident.model, ident.firmware, ident.serial)
            case lp.GetSetpoint():
                return lp.SetpointReply(self.model.setpoint)
            case lp.SetSetpoint(value):
                return self.store_setpoint(value, now, channel)
            case lp.GetTemperature():
                return lp.TemperatureReply(self.state(now).temperature)
            case lp.GetState():
                return lp.StateReply(self.state(now))
            case lp.GetLimits():
                return lp.LimitsReply(self.limits)
        raise TypeError(f"not a request: {request!r}")  # pragma: no cover

    def answer_text(self, request: TextRequest, now: float, channel: str) -> bytes:
        """The reply line to a parsed request, with the request's address prefix.

        A checksummed request gets a checksummed reply; one without, a reply without.
        """
        reply: lp.Reply
        if request.request is None:
            reply = lp.ErrorReply(request.error or "SYNTAX")
        else:
            reply = self.answer(request.request, now, channel)
        text = lp.format_reply(reply)
        if request.address is not None:
            text = f"@{request.address} {text}"
        # A reply of our own making is a valid line: encode it without encode_line's checks.
        data = text.encode("ascii")
        if request.checksummed:
            data += b"*%02X" % lp.checksum(data)
        return data + lp.TERMINATOR

    def respond(self, line: bytes, now: float, channel: str = "device") -> bytes | None:
        """The reply of a point-to-point device to one request line; None for a blank line
        or an addressed request (only devices with an address answer those)."""
        request = parse_text_request(line)
        if request is None or request.address is not None:
            return None
        return self.answer_text(request, now, channel)


# --- faults ------------------------------------------------------------------------------


class ReplyDamage(Protocol):
    """How a wire's replies are damaged: the checksum is the line protocol's or the CRC."""

    def corrupt(self, reply: bytes) -> bytes:
        """A bit error in the reply, so that its checksum fails."""

    def wrong_checksum(self, reply: bytes) -> bytes: ...

    def no_checksum(self, reply: bytes) -> bytes: ...

    @property
    def noise(self) -> bytes:
        """Bytes of line noise sent before a reply."""


def corrupt(reply: bytes) -> bytes:
    """A reply hit by a bit error: one byte of its text flipped, so its checksum fails."""
    content = reply.rstrip(b"\r\n")
    end = content.find(b"*")
    text_len = end if end >= 0 else len(content)
    if text_len == 0:
        return reply
    index = text_len // 2
    flipped = content[index] ^ 0x01
    if flipped == ord("*") or not 0x20 <= flipped < 0x7F:
        flipped = content[index] ^ 0x02
    return content[:index] + bytes([flipped]) + content[index + 1 :] + lp.TERMINATOR


class TextDamage:
    """Damage to line-protocol replies."""

    noise = STRAY_NOISE

    def corrupt(self, reply: bytes) -> bytes:
        return corrupt(reply)

    def wrong_checksum(self, reply: bytes) -> bytes:
        content = reply.rstrip(b"\r\n")
        if not _HAS_CHECKSUM.fullmatch(content):
            return reply
        wrong = int(content[-2:], 16) ^ 0x5A
        return content[:-2] + b"%02X" % wrong + lp.TERMINATOR

    def no_checksum(self, reply: bytes) -> bytes:
        content = reply.rstrip(b"\r\n")
        if not _HAS_CHECKSUM.fullmatch(content):
            return reply
        return content[:-3] + lp.TERMINATOR


TEXT_DAMAGE = TextDamage()

COUNTED_FAULTS = ("GARBAGE", "STRAY", "BADSUM", "NOSUM")


@dataclass
class Faults:
    """The faults in force on a unit, or on a whole line. Pure: times are passed in."""

    unplugged_until: float | None = None
    silent_until: float | None = None
    slow_s: float = 0.0
    slow_write_s: float = 0.0
    """Added to replies to writes only: a unit whose EEPROM takes its time."""
    garbage: int = 0
    stray: int = 0
    bad_checksum: int = 0
    no_checksum: int = 0

    def silent(self, now: float) -> bool:
        return self.silent_until is not None and now < self.silent_until

    def unplugged(self, now: float) -> bool:
        return self.unplugged_until is not None and now < self.unplugged_until

    def clear(self) -> None:
        for spec in fields(self):
            setattr(self, spec.name, spec.default)

    def set(self, kind: str, amount: float, now: float) -> None:
        """Put a fault in force (CLEAR clears them all). Raises ValueError if unknown."""
        match kind:
            case "CLEAR":
                self.clear()
            case "UNPLUG":
                self.unplugged_until = now + amount
            case "SILENT":
                self.silent_until = now + amount
            case "SLOW":
                self.slow_s = amount / 1000
            case "SLOWWRITE":
                self.slow_write_s = amount / 1000
            case "GARBAGE":
                self.garbage = int(amount)
            case "STRAY":
                self.stray = int(amount)
            case "BADSUM":
                self.bad_checksum = int(amount)
            case "NOSUM":
                self.no_checksum = int(amount)
            case _:
                raise ValueError(f"unknown fault {kind!r}")

    def mangle(self, reply: bytes, damage: ReplyDamage = TEXT_DAMAGE) -> bytes:
        """Apply the counted faults to one reply, using one count of each."""
        if not (self.no_checksum or self.bad_checksum or self.garbage or self.stray):
            return reply
        if self.no_checksum > 0:
            self.no_checksum -= 1
            reply = damage.no_checksum(reply)
        if self.bad_checksum > 0:
            self.bad_checksum -= 1
            reply = damage.wrong_checksum(reply)
        if self.garbage > 0:
            self.garbage -= 1
            reply = damage.corrupt(reply)
        if self.stray > 0:
            self.stray -= 1
            reply = damage.noise + reply
        return reply


# --- the front panel ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PanelSetpoint:
    value: float


@dataclass(frozen=True, slots=True)
class FaultCommand:
    kind: str
    """UNPLUG, SILENT (seconds), SLOW and SLOWWRITE (ms), GARBAGE, STRAY, BADSUM, NOSUM
    (count), CLEAR."""
    amount: float = 0.0


_FAULT_UNITS = {
    "UNPLUG": "seconds",
    "SILENT": "seconds",
    "SLOW": "ms",
    "SLOWWRITE": "ms",
    "GARBAGE": "count",
    "STRAY": "count",
    "BADSUM": "count",
    "NOSUM": "count",
}


def parse_panel_command(payload: str) -> PanelSetpoint | FaultCommand | None:
    """A panel-only command, or None if the payload is an ordinary device request."""
    words = payload.split()
    upper = [word.upper() for word in words]
    if upper[:1] == ["PANEL"]:
        if upper[1:2] != ["SP"] or len(words) != 3:
            raise lp.RequestError("SYNTAX", "usage: PANEL SP <value>")
        try:
            return PanelSetpoint(lp.parse_number(words[2]))
        except ValueError as exc:
            raise lp.RequestError("SYNTAX", str(exc)) from exc
    if upper[:1] != ["FAULT"]:
        return None
    if upper[1:] == ["CLEAR"]:
        return FaultCommand("CLEAR")
    if len(words) != 3 or upper[1] not in _FAULT_UNITS:
        raise lp.RequestError("SYNTAX", f"usage: FAULT {{{'|'.join(_FAULT_UNITS)}}} <n>|CLEAR")
    try:
        amount = lp.parse_number(words[2])
    except ValueError as exc:
        raise lp.RequestError("SYNTAX", str(exc)) from exc
    if amount < 0 or (_FAULT_UNITS[upper[1]] == "count" and not amount.is_integer()):
        raise lp.RequestError("SYNTAX", f"bad amount {words[2]!r}")
    return FaultCommand(upper[1], amount)
