"""The fake controller's pure core: what one unit answers in the line protocol, the faults
in force on a unit or on the whole line, the front panel's commands, and line times.

Every unit is a whole thermostat: besides its set point and temperature (the thermal
model's) it has the points of the `sim` profile (agent.controller.sim_profile): heating and
cooling set points, which it keeps the profile's deadband apart, mode, fan, occupancy and
humidity. A line's profile says how they appear on the wire (`GET POINTS`, `SET <name>`;
its Modbus registers, `rtu`); the panel names them as the `sim` profile's line protocol
does, on any line.

No I/O; times are passed in. `line` puts units on a line, `endpoints` on the wire.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, fields
from typing import Protocol, TypeVar

from agent.controller import line_protocol as lp
from agent.controller.interface import (
    DEFAULT_LIMITS,
    ControllerState,
    DeviceIdentity,
    Limits,
    PointValue,
    round_to_step,
)
from agent.controller.line_profile import LineProfile
from agent.controller.points import POINTS, InvalidValue, Kind, check_deadband
from agent.controller.profile import Profile
from agent.controller.sim_profile import SIM, SIM_LINE
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


SIM_VALUES: dict[str, PointValue] = {
    "heatSetPoint": 20.0,
    "coolSetPoint": 24.0,
    "mode": "heat",
    "fan": "auto",
    "occupied": True,
    "humidity": 45.0,
}
"""What a unit's points besides set point and temperature hold when it starts."""

HUMIDITY_LIMITS = Limits(0.0, 100.0, 0.1)


@dataclass(frozen=True, slots=True)
class WriteRecord:
    """A write the device received (SET SP or a Modbus write on its line, PANEL SP at the
    panel), or of another point (`point`: SET H, PANEL M, a write of its register)."""

    at: float
    """time.monotonic() at the device when it processed the request."""
    value: PointValue
    stored: PointValue | None
    """The value stored, a number rounded to its step; None if refused (out of range,
    not a value of the point, against the deadband)."""
    channel: str
    point: str = "setPoint"


# --- requests as a device on the line sees them ---------------------------------------

_KINDS: dict[type[lp.Request], str] = {
    lp.Identify: "ID",
    lp.GetSetpoint: "GET SP",
    lp.SetSetpoint: "SET SP",
    lp.GetTemperature: "GET T",
    lp.GetState: "GET STATE",
    lp.GetLimits: "GET LIMITS",
    lp.GetPoints: "GET POINTS",
}
INVALID = "INVALID"
"""The kind of a request that is not one: bad framing, checksum or command."""


@dataclass(frozen=True, slots=True)
class TextRequest:
    """One request line, parsed once for every device on the line."""

    address: int | None
    """The `@<n>` prefix's n; None without a prefix; NO_ADDRESS if it is malformed."""
    kind: str
    """ID, GET SP, SET SP, GET T, GET STATE, GET LIMITS, GET POINTS, SET <name>, or
    INVALID."""
    value: float | None
    """The value of a SET SP, or of a SET <name> of a number."""
    request: lp.Request | None
    error: str | None
    """The code of the ERR reply the addressed device sends, when not a request."""
    checksummed: bool
    point: str | None = None
    """The point a SET writes."""


def parse_text_request(line: bytes | None, points: LineProfile = SIM_LINE) -> TextRequest | None:
    """The request in a received line (None: a line too long to keep); None if blank;
    `points`: the names of the units' points.

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
        request = lp.parse_request(text[skip:].decode("ascii"), points.writable_names)
    except lp.RequestError as exc:
        return TextRequest(address, INVALID, None, None, exc.code, checksummed)
    if isinstance(request, lp.SetValue):
        point = points.point(request.name)
        number = None
        if point is not None and POINTS[point].kind is Kind.NUMBER:
            with contextlib.suppress(ValueError):
                number = lp.parse_number(request.value)
        kind = f"SET {request.name}"
        return TextRequest(address, kind, number, request, None, checksummed, point)
    if isinstance(request, lp.SetSetpoint):
        return TextRequest(address, "SET SP", request.value, request, None, checksummed, "setPoint")
    return TextRequest(address, _KINDS[type(request)], None, request, None, checksummed)


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
        profile: Profile = SIM,
    ) -> None:
        self.limits = limits
        self.identity = identity
        self.record_limit = record_limit
        self.profile = profile
        """How its points appear on the wire (its line map, its registers)."""
        self.values: dict[str, PointValue] = dict(SIM_VALUES)
        """Its points besides set point and temperature, by name."""
        self.factory_setpoint = round_to_step(setpoint, limits)
        """The set point it comes with, and comes back to after a reset."""
        self.model = ThermalModel(
            setpoint=self.factory_setpoint,
            temperature=temperature,
            now=now,
            time_constant_s=time_constant_s,
        )
        self.writes: list[WriteRecord] = []
        """The last record_limit SET SP (or Modbus writes) received on the line."""
        self.panel_changes: list[WriteRecord] = []
        """The last record_limit PANEL SP (and PANEL of the other points)."""

    def state(self, now: float) -> ControllerState:
        state = self.model.state(now)
        # The sensor resolves 0.1 °C.
        return ControllerState(
            setpoint=state.setpoint,
            temperature=round(state.temperature, 1),
            output=state.output,
            mode=state.mode,
        )

    def point_values(self, now: float) -> dict[str, PointValue]:
        """Every point's value now, by name."""
        state = self.state(now)
        return {"setPoint": state.setpoint, "temperature": state.temperature, **self.values}

    def limits_of(self, point: str) -> Limits:
        """The values a number takes (the set point's: the unit's own limits)."""
        if point == "setPoint":
            return self.limits
        if point == "humidity":
            return HUMIDITY_LIMITS
        found = self.profile.limits(point) or SIM.limits(point)
        assert found is not None
        return found

    def store_point(
        self, point: str, value: PointValue, now: float, channel: str
    ) -> lp.ErrorReply | None:
        """Store a point's value (a number rounded to its step) or refuse it with the
        line protocol's error; record it as a write (a panel change on the panel)."""
        refused = self._refusal(point, value)
        stored: PointValue | None = None
        if refused is None:
            stored = value
            if point == "temperature":
                assert isinstance(value, float)
                stored = round(value, 1)  # the sensor resolves 0.1 °C
                self.model.advance(now)
                self.model.temperature = stored
            else:
                if POINTS[point].kind is Kind.NUMBER:
                    assert isinstance(value, float)
                    stored = round_to_step(value, self.limits_of(point))
                self.values[point] = stored
        record = WriteRecord(at=now, value=value, stored=stored, channel=channel, point=point)
        append_bounded(
            self.panel_changes if channel == "panel" else self.writes, record, self.record_limit
        )
        return refused

    def _refusal(self, point: str, value: PointValue) -> lp.ErrorReply | None:
        known = POINTS[point]
        if known.kind is Kind.CHOICE:
            return None if value in known.choices else lp.ErrorReply("VALUE")
        if known.kind is Kind.SWITCH:
            return None if isinstance(value, bool) else lp.ErrorReply("VALUE")
        if not isinstance(value, float):
            return lp.ErrorReply("VALUE")
        if point == "temperature":
            return None
        limits = self.limits_of(point)
        if not limits.min <= value <= limits.max:
            shown = (lp.format_number(limits.min), lp.format_number(limits.max))
            return lp.ErrorReply("RANGE", shown)
        stored = round_to_step(value, limits)
        heat, cool = self.values["heatSetPoint"], self.values["coolSetPoint"]
        if point in ("heatSetPoint", "coolSetPoint"):
            assert isinstance(heat, float) and isinstance(cool, float)
            heat, cool = (stored, cool) if point == "heatSetPoint" else (heat, stored)
            if check_deadband(heat, cool, self.profile.deadband) is not None:
                return lp.ErrorReply("DEADBAND", (lp.format_number(self.profile.deadband),))
        return None

    def set_value(self, point: str, text: str, now: float, channel: str) -> lp.Reply:
        """`SET <name> <text>` (or the panel's `PANEL <name> <text>`, `points` the sim's
        line map): the value as stored, or the error."""
        points = self.profile.line if channel != "panel" else SIM_LINE
        assert points is not None
        try:
            value = points.decode(point, text)
        except InvalidValue:
            return lp.ErrorReply("SYNTAX" if POINTS[point].kind is Kind.NUMBER else "VALUE")
        if isinstance(value, float) and point == "setPoint":
            return self.store_setpoint(value, now, channel)
        refused = self.store_point(point, value, now, channel)
        if refused is not None:
            return refused
        stored = self.point_values(now)[point]
        return lp.ValueStored(points.name(point), points.encode(point, stored))

    def reset(self, now: float) -> None:
        """Back to its factory values: a reset, a power cut of a unit that keeps nothing, a
        replacement out of the box."""
        self.values = dict(SIM_VALUES)
        self.model.set_setpoint(self.factory_setpoint, now)

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
            case lp.GetPoints():
                points = self.profile.line
                if points is None:
                    return lp.ErrorReply("UNKNOWN")
                return lp.PointsReply(points.fields(self.point_values(now)))
            case lp.SetValue(name, text):
                point = None if self.profile.line is None else self.profile.line.point(name)
                if point is None or not POINTS[point].writable:
                    return lp.ErrorReply("UNKNOWN")
                return self.set_value(point, text, now, channel)
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
        request = parse_text_request(line, self.profile.line or SIM_LINE)
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

    def readdress(self, reply: bytes, address: int) -> bytes:
        """The reply as if unit `address` sent it, its checksum made good."""


COLLISION_SKEW_BITS = 3
"""How far behind the first the second of two units answering together starts: a few bit
times, as two units' turnarounds differ."""


def collide(first: bytes, second: bytes, skew_bits: int = COLLISION_SKEW_BITS) -> bytes:
    """What the master receives when two units at one address answer together: both drive
    the wire (a driven 0 wins over the idle 1), the second `skew_bits` behind, and the
    master's UART reads characters out of the sum (8N1 frames: a start bit, eight data bits
    least significant first, a stop bit). Garbage, as on a real bus, never either reply."""

    def bits(data: bytes, lead: int) -> list[int]:
        out = [1] * lead
        for byte in data:
            out += [0, *((byte >> i) & 1 for i in range(8)), 1]
        return out

    a, b = bits(first, 0), bits(second, skew_bits)
    length = max(len(a), len(b))
    a += [1] * (length - len(a))
    b += [1] * (length - len(b))
    wire = [x & y for x, y in zip(a, b, strict=True)]
    received = bytearray()
    index = 0
    while index + 9 < len(wire):
        if wire[index]:
            index += 1  # idle: wait for a start bit
            continue
        received.append(sum(bit << i for i, bit in enumerate(wire[index + 1 : index + 9])))
        index += 10
    return bytes(received)


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

    def readdress(self, reply: bytes, address: int) -> bytes:
        content = reply.rstrip(b"\r\n")
        checksummed = _HAS_CHECKSUM.fullmatch(content) is not None
        text = (content[:-3] if checksummed else content).decode("ascii")
        _, payload = lp.split_address(text)
        return lp.encode_line(lp.with_address(address, payload), with_checksum=checksummed)


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
    late_s: float = 0.0
    """The reply comes this long after the request, out of turn: the line is not held for
    it, so it may come in the middle of the next transaction."""
    as_address: int | None = None
    """The replies carry this address (a unit set to the wrong address)."""
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
            case "LATE":
                self.late_s = amount / 1000
            case "ASADDRESS":
                self.as_address = lp.check_address(int(amount))
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
        if self.as_address is not None:
            reply = damage.readdress(reply, self.as_address)
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
class PanelValue:
    """`PANEL <name> <value>`: a person changes a point at the device (names as the sim
    profile's line protocol: H, C, M, F, O, RH, T)."""

    point: str
    text: str


@dataclass(frozen=True, slots=True)
class FaultCommand:
    kind: str
    """UNPLUG, SILENT, POWERCYCLE (seconds), SLOW, SLOWWRITE and LATE (ms), GARBAGE, STRAY,
    BADSUM, NOSUM (count), ASADDRESS (an address), RESET, CLEAR."""
    amount: float = 0.0


_FAULT_UNITS = {
    "UNPLUG": "seconds",
    "SILENT": "seconds",
    "POWERCYCLE": "seconds",
    "SLOW": "ms",
    "SLOWWRITE": "ms",
    "LATE": "ms",
    "ASADDRESS": "address",
    "GARBAGE": "count",
    "STRAY": "count",
    "BADSUM": "count",
    "NOSUM": "count",
}


_PANEL_USAGE = f"usage: PANEL {{{'|'.join(s.name for s in SIM_LINE.points.values())}}} <value>"


def parse_panel_command(payload: str) -> PanelSetpoint | PanelValue | FaultCommand | None:
    """A panel-only command, or None if the payload is an ordinary device request."""
    words = payload.split()
    upper = [word.upper() for word in words]
    if upper[:1] == ["PANEL"]:
        point = SIM_LINE.point(upper[1]) if len(words) == 3 else None
        if point is None:
            raise lp.RequestError("SYNTAX", _PANEL_USAGE)
        if point != "setPoint":
            return PanelValue(point, upper[2])
        try:
            return PanelSetpoint(lp.parse_number(words[2]))
        except ValueError as exc:
            raise lp.RequestError("SYNTAX", str(exc)) from exc
    if upper[:1] != ["FAULT"]:
        return None
    if upper[1:] in (["CLEAR"], ["RESET"]):
        return FaultCommand(upper[1])
    if len(words) != 3 or upper[1] not in _FAULT_UNITS:
        usage = f"usage: FAULT {{{'|'.join(_FAULT_UNITS)}}} <n>|RESET|CLEAR"
        raise lp.RequestError("SYNTAX", usage)
    try:
        amount = lp.parse_number(words[2])
    except ValueError as exc:
        raise lp.RequestError("SYNTAX", str(exc)) from exc
    unit = _FAULT_UNITS[upper[1]]
    if amount < 0 or (unit in ("count", "address") and not amount.is_integer()):
        raise lp.RequestError("SYNTAX", f"bad amount {words[2]!r}")
    if unit == "address" and not lp.MIN_ADDRESS <= amount <= lp.MAX_ADDRESS:
        raise lp.RequestError("SYNTAX", f"bad amount {words[2]!r}")
    return FaultCommand(upper[1], amount)
