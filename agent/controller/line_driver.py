"""The line-protocol driver: controllers speaking the ASCII line protocol, through pyserial.

Any pyserial URL works: a device path (/dev/ttyUSB0, /dev/serial/by-id/...), opened
exclusively; socket://host:port and rfc2217://host:port for serial device servers. On a
multi-drop line each unit has an address and every request carries its `@<n> ` prefix;
a point-to-point controller (no address) gets plain requests.

A unit with a profile (its `line` map, agent.controller.line_profile) is read whole with
`GET POINTS` and written point by point with `SET <name> <value>`, whose `OK <name> <value>`
is the read-back; one without is read with `GET STATE`, as always.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TypeVar

import serial  # type: ignore[import-untyped]

from agent.controller import line_protocol as lp
from agent.controller.driver import CorruptReply, Driver, Gate, Unit, open_gate
from agent.controller.interface import (
    ControllerError,
    ControllerState,
    DeviceIdentity,
    Limits,
    PointValue,
    SetpointRejected,
)
from agent.controller.line_profile import LineProfile
from agent.controller.points import InvalidValue
from agent.controller.port import SerialPort

log = logging.getLogger(__name__)

TURNAROUND_S = 0.2
"""The device answers within 200 ms (the line protocol's contract)."""

POLL_REQUEST_BYTES = len(lp.encode_line("@247 GET STATE"))
POLL_REPLY_BYTES = len(lp.encode_line("@247 STATE SP=35.0 T=-10.5 OUT=100 MODE=HEAT"))
LONGEST_REPLY_BYTES = lp.MAX_LINE + len(lp.TERMINATOR)
LONGEST_REQUEST_BYTES = len(lp.encode_line("@247 SET SP -10.55"))

R = TypeVar("R", bound=lp.Reply)


class LineDriver(Driver):
    """Controllers on a serial line, speaking the ASCII line protocol."""

    def __init__(
        self,
        url: str,
        *,
        baudrate: int = 9600,
        parity: str = serial.PARITY_NONE,
        bytesize: int = serial.EIGHTBITS,
        stopbits: float = serial.STOPBITS_ONE,
        reply_timeout_s: float | None = None,
        extra_gap_s: float = 0.0,
        exclusive: bool | None = None,
    ) -> None:
        self._set_line(
            url,
            baudrate=baudrate,
            parity=parity,
            bytesize=bytesize,
            stopbits=stopbits,
            turnaround_s=TURNAROUND_S,
            longest_reply=lp.MAX_LINE,
            reply_timeout_s=reply_timeout_s,
            extra_gap_s=extra_gap_s,
        )
        options = {} if exclusive is None else {"exclusive": exclusive}
        self.port = SerialPort(
            url,
            self.stats,
            baudrate=baudrate,
            parity=parity,
            bytesize=bytesize,
            stopbits=stopbits,
            **options,
        )
        self.exclusive = self.port.exclusive
        self._replies = LineReplies(self.port)

    @property
    def poll_frame(self) -> tuple[int, int]:
        return POLL_REQUEST_BYTES, POLL_REPLY_BYTES

    @property
    def longest_transaction_s(self) -> float:
        return self.transaction_s(LONGEST_REQUEST_BYTES, LONGEST_REPLY_BYTES)

    def reply_wait_s(self, request_bytes: int) -> float:
        # A reply is read whole, by its terminator: the longest one's line time counts too.
        return self.reply_timeout_s + self.timing.chars_s(request_bytes + lp.MAX_LINE)

    @property
    def worst_case_call_s(self) -> float:
        # A wait for a late reply and a quiet line after a timeout, then the request's
        # own line time, the reply timeout and the longest reply; twice that.
        exchange = (
            self.longest_late_reply_wait_s
            + self.reply_timeout_s
            + self.timing.chars_s(2 * lp.MAX_LINE)
        )
        # Opening a socket:// URL may take pyserial's own 5 s connect timeout.
        return max(2 * exchange, 6.0)

    # --- the port ---------------------------------------------------------------------

    def open(self) -> None:
        self.port.open()
        self._late_reply_from.clear()

    def close(self) -> None:
        self.port.close()

    def fileno(self) -> int | None:
        """The open port's descriptor (a tty), for tests that look at it."""
        return self.port.fileno()

    # --- transactions -----------------------------------------------------------------

    def poll_frames(self, unit: Unit) -> list[tuple[int, int]]:
        points = _line_map(unit)
        return [self.poll_frame if points is None else points.poll_frame()]

    def read_state(self, unit: Unit, gate: Gate = open_gate) -> ControllerState:
        points = _line_map(unit)
        if points is None:
            return self._transact(unit, lp.GetState(), lp.StateReply, gate).state
        reply = self._transact(unit, lp.GetPoints(), lp.PointsReply, gate)
        try:
            values = points.decode_all(reply.fields)
        except InvalidValue as exc:
            self.stats.corrupt_replies += 1
            raise ControllerError(f"{unit.name}: nonsense reply to GET POINTS: {exc}") from exc
        setpoint, temperature = values.pop("setPoint"), values["temperature"]
        assert isinstance(setpoint, float) and isinstance(temperature, float)
        return ControllerState(setpoint, temperature, None, None, values)

    def read_limits(self, unit: Unit, gate: Gate = open_gate) -> Limits:
        return self._transact(unit, lp.GetLimits(), lp.LimitsReply, gate).limits

    def read_setpoint(self, unit: Unit, gate: Gate = open_gate) -> float:
        return self._transact(unit, lp.GetSetpoint(), lp.SetpointReply, gate).value

    def write_setpoint(self, unit: Unit, value: float, gate: Gate = open_gate) -> float:
        # `OK SP <value>` is the value as the controller stored it: its read-back.
        return self._transact(unit, lp.SetSetpoint(value), lp.SetpointStored, gate).value

    def write_point(
        self, unit: Unit, point: str, value: PointValue, gate: Gate = open_gate
    ) -> PointValue:
        """`SET <name> <value>` (the set point: SET SP); its `OK <name> <value>` is the
        read-back. InvalidValue, before a byte goes out, for a value the map has no text
        for."""
        points = _line_map(unit)
        if point == "setPoint" or points is None or point not in points.points:
            return super().write_point(unit, point, value, gate)
        name = points.name(point)
        if name not in points.writable_names:
            raise ControllerError(f"{unit.name}: {point} is read only")
        request = lp.SetValue(name, points.encode(point, value))
        reply = self._transact(unit, request, lp.ValueStored, gate, point)
        try:
            if reply.name != name:
                raise InvalidValue(f"the reply is for {reply.name}")
            return points.decode(point, reply.value)
        except InvalidValue as exc:
            self.stats.corrupt_replies += 1
            raise ControllerError(
                f"{unit.name}: nonsense reply to {lp.format_request(request)!r}: {exc}"
            ) from exc

    def identify(self, unit: Unit, gate: Gate = open_gate) -> DeviceIdentity:
        reply = self._transact(unit, lp.Identify(), lp.IdReply, gate)
        return DeviceIdentity(reply.model, reply.firmware, reply.serial)

    def _transact(
        self,
        unit: Unit,
        request: lp.Request,
        expected: type[R],
        gate: Gate,
        point: str = "setPoint",
    ) -> R:
        """Send one request to `unit` and return its reply, of the expected type."""
        what = lp.with_address(unit.address, lp.format_request(request))
        line = lp.encode_line(what)
        lasts_s = self.transaction_s(len(line), LONGEST_REPLY_BYTES)
        payload = self._exchange(unit, repr(what), line, self._replies, lasts_s, gate)
        try:
            reply = lp.parse_reply(payload)
        except lp.ProtocolError as exc:
            self.stats.corrupt_replies += 1
            raise ControllerError(f"nonsense reply to {what!r}: {exc}") from exc
        if isinstance(reply, lp.ErrorReply):
            why = _refusal(request, reply, point)
            if why is not None:
                raise SetpointRejected(f"controller refused {what!r}: {reply} ({why})")
            raise ControllerError(f"controller refused {what!r}: {reply}")
        if not isinstance(reply, expected):
            raise ControllerError(f"unexpected reply to {what!r}: {reply}")
        return reply


class LineReplies:
    """Reply lines off the port: noise between them dropped, each reply's address split
    off its payload."""

    def __init__(self, port: SerialPort) -> None:
        self.port = port
        self._splitter = lp.LineSplitter(max_line=4 * lp.MAX_LINE)
        self._lines: deque[bytes | None] = deque()

    def clear(self) -> None:
        self._splitter.clear()
        self._lines.clear()

    def next_reply(self, deadline: float) -> tuple[int | None, str] | None:
        while True:
            while self._lines:
                line = self._lines.popleft()
                if line is None:
                    raise CorruptReply("too long")
                log.debug("received %r", line)
                try:
                    frame = lp.salvage_reply(line)
                    if frame is None:
                        log.debug("discarded noise %r", line)
                        continue
                    return lp.split_address(frame.payload)
                except (lp.FramingError, lp.ProtocolError) as exc:
                    raise CorruptReply(str(exc)) from exc
            if time.monotonic() >= deadline:
                return None
            self._lines.extend(self._splitter.feed(self.port.read(4 * lp.MAX_LINE, deadline)))


def _line_map(unit: Unit) -> LineProfile | None:
    """The unit's points on the line, when it has a profile (None: the set point alone)."""
    return None if unit.profile is None else unit.profile.line


_REFUSALS = frozenset({"RANGE", "DEADBAND", "VALUE"})


def _refusal(request: lp.Request, reply: lp.ErrorReply, point: str) -> str | None:
    """Why the unit refused a value, as a person reads it; None for an error that is no
    refusal of the value (a syntax error, an unknown command)."""
    if isinstance(request, lp.SetSetpoint):
        shown = lp.format_number(request.value)
    elif isinstance(request, lp.SetValue):
        shown = request.value
    else:
        return None
    if reply.code not in _REFUSALS or (
        isinstance(request, lp.SetSetpoint) and reply.code != "RANGE"
    ):
        return None
    match reply.code, reply.args:
        case "RANGE", (low, high):
            try:
                value, lowest, highest = (lp.parse_number(t) for t in (shown, low, high))
            except ValueError:
                return f"{point} {shown} is outside the unit's limits {low}..{high}"
            if value > highest:
                return f"{value:g} is above the limit {highest:g}"
            if value < lowest:
                return f"{value:g} is below the limit {lowest:g}"
            return f"{point} {shown} is outside the unit's limits {low}..{high}"
        case "DEADBAND", (deadband, *_):
            return (
                f"{point} {shown}: the unit keeps its cooling set point at least {deadband} "
                "above its heating set point"
            )
        case "VALUE", _:
            return f"the unit does not take {point} {shown}"
    return f"the unit refused {point} {shown}"
