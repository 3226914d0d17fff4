"""The line-protocol driver: controllers speaking the ASCII line protocol, through pyserial.

Any pyserial URL works: a device path (/dev/ttyUSB0, /dev/serial/by-id/...), opened
exclusively; socket://host:port and rfc2217://host:port for serial device servers. On a
multi-drop line each unit has an address and every request carries its `@<n> ` prefix;
a point-to-point controller (no address) gets plain requests.
"""

from __future__ import annotations

import logging
import termios
import time
from typing import Any, TypeVar

import serial  # type: ignore[import-untyped]

from agent.controller import line_protocol as lp
from agent.controller.driver import Driver, LinkLost, Unit, is_device_path
from agent.controller.interface import (
    ControllerError,
    ControllerState,
    ControllerUnavailable,
    DeviceIdentity,
    Limits,
    SetpointRejected,
)

log = logging.getLogger(__name__)

TURNAROUND_S = 0.2
"""The device answers within 200 ms (the line protocol's contract)."""

POLL_REQUEST_BYTES = len(lp.encode_line("@247 GET STATE"))
POLL_REPLY_BYTES = len(lp.encode_line("@247 STATE SP=35.0 T=-10.5 OUT=100 MODE=HEAT"))

R = TypeVar("R", bound=lp.Reply)

# What pyserial raises when the port goes away: SerialException (an OSError), a bare
# OSError from os.read/ioctl, or termios.error from tcflush on a hung-up tty.
_PORT_ERRORS = (serial.SerialException, OSError, termios.error)


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
        # Exclusive open is a flock() on a local tty; URLs have no such thing.
        self.exclusive = is_device_path(url) if exclusive is None else exclusive
        self._settings: dict[str, Any] = {
            "baudrate": baudrate,
            "parity": parity,
            "bytesize": bytesize,
            "stopbits": stopbits,
            "write_timeout": self.reply_timeout_s,
        }
        if is_device_path(url):
            self._settings["exclusive"] = self.exclusive
        # Catch a bad URL scheme, baud rate or parity now rather than retry it forever.
        serial.serial_for_url(url, do_not_open=True, **self._settings)
        self._port: serial.Serial | None = None
        self._splitter = lp.LineSplitter(max_line=4 * lp.MAX_LINE)
        self._late_reply_possible = False

    @property
    def poll_frame(self) -> tuple[int, int]:
        return POLL_REQUEST_BYTES, POLL_REPLY_BYTES

    @property
    def worst_case_call_s(self) -> float:
        # A wait for a quiet line after a timeout (up to 4 reply timeouts), then the
        # request's own line time, the reply timeout and the longest reply; twice that.
        exchange = 5 * self.reply_timeout_s + self.timing.chars_s(2 * lp.MAX_LINE)
        # Opening a socket:// URL may take pyserial's own 5 s connect timeout.
        return max(2 * exchange, 6.0)

    # --- the port ---------------------------------------------------------------------

    def open(self) -> None:
        self.close()
        try:
            self._port = serial.serial_for_url(self.url, **self._settings)
        except _PORT_ERRORS as exc:
            raise LinkLost(f"cannot open {self.url}: {exc}") from exc
        self._late_reply_possible = False
        log.debug("opened %s", self.url)

    def close(self) -> None:
        port, self._port = self._port, None
        if port is None:
            return
        # pyserial's socket:// close() skips closing the socket when shutdown() fails,
        # as it does once the peer is gone: close it here too, or the fd leaks.
        sock = getattr(port, "_socket", None)
        try:
            port.close()
        except Exception as exc:  # closing a vanished port may fail; it is closed anyway
            log.debug("closing %s: %s", self.url, exc)
        if sock is not None:
            sock.close()

    def fileno(self) -> int | None:
        """The open port's descriptor (a tty), for tests that look at it."""
        return None if self._port is None else self._port.fileno()

    # --- transactions -----------------------------------------------------------------

    def read_state(self, unit: Unit) -> ControllerState:
        return self._transact(unit, lp.GetState(), lp.StateReply).state

    def read_limits(self, unit: Unit) -> Limits:
        return self._transact(unit, lp.GetLimits(), lp.LimitsReply).limits

    def read_setpoint(self, unit: Unit) -> float:
        return self._transact(unit, lp.GetSetpoint(), lp.SetpointReply).value

    def write_setpoint(self, unit: Unit, value: float) -> float:
        # `OK SP <value>` is the value as the controller stored it: its read-back.
        return self._transact(unit, lp.SetSetpoint(value), lp.SetpointStored).value

    def identify(self, unit: Unit) -> DeviceIdentity:
        reply = self._transact(unit, lp.Identify(), lp.IdReply)
        return DeviceIdentity(reply.model, reply.firmware, reply.serial)

    def _transact(self, unit: Unit, request: lp.Request, expected: type[R]) -> R:
        """Send one request to `unit` and return its reply, of the expected type."""
        port = self._port
        if port is None:
            raise LinkLost("port is not open")
        what = lp.with_address(unit.address, lp.format_request(request))
        line = lp.encode_line(what)
        try:
            # Stale bytes (a late reply, line noise) must not be taken for this reply. On
            # a multi-drop line the address tells a late reply of another unit apart; a
            # point-to-point controller's late reply can only be waited out.
            if self._late_reply_possible and unit.address is None:
                self._wait_for_quiet(port)
            port.reset_input_buffer()
            self._splitter.clear()
            port.write(line)
            self.stats.transactions += 1
            self.stats.bytes_sent += len(line)
            log.debug("sent %r", line)
            payload = self._read_reply(port, unit, what, len(line))
        except ControllerUnavailable:
            self._late_reply_possible = True
            self.stats.timeouts += 1
            self.stats.per_unit_timeouts[unit.name] = (
                self.stats.per_unit_timeouts.get(unit.name, 0) + 1
            )
            raise
        except ControllerError:
            self.stats.corrupt_replies += 1
            raise
        except _PORT_ERRORS as exc:
            raise LinkLost(str(exc)) from exc
        try:
            reply = lp.parse_reply(payload)
        except lp.ProtocolError as exc:
            self.stats.corrupt_replies += 1
            raise ControllerError(f"nonsense reply to {what!r}: {exc}") from exc
        if isinstance(reply, lp.ErrorReply):
            refused = isinstance(request, lp.SetSetpoint) and reply.code == "RANGE"
            error = SetpointRejected if refused else ControllerError
            raise error(f"controller refused {what!r}: {reply}")
        if not isinstance(reply, expected):
            raise ControllerError(f"unexpected reply to {what!r}: {reply}")
        return reply

    def _wait_for_quiet(self, port: serial.Serial) -> None:
        """Discard input until the line has been quiet for a reply timeout.

        A reply that missed its deadline may still arrive; without this it would be
        taken for the reply to the next request, which could be of the same kind.
        """
        give_up = time.monotonic() + 4 * self.reply_timeout_s
        while time.monotonic() < give_up:
            port.timeout = self.reply_timeout_s
            chunk = port.read(max(1, port.in_waiting))
            if not chunk:
                break
            self.stats.bytes_received += len(chunk)
            log.debug("discarded a late reply %r", chunk)
        self._late_reply_possible = False

    def _read_reply(self, port: serial.Serial, unit: Unit, what: str, sent: int) -> str:
        """The reply's payload without its address prefix."""
        # The clock starts once the request is on the wire; write() returns earlier.
        deadline = time.monotonic() + self.reply_timeout_s + self.timing.chars_s(sent + lp.MAX_LINE)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ControllerUnavailable(f"no reply to {what!r} within {self.reply_timeout_s} s")
            # The first byte with a timeout, then whatever else has come without waiting: a
            # byte at a time (in_waiting says 1 on socket://) costs a system call each.
            port.timeout = remaining
            chunk = port.read(1)
            if not chunk:
                continue
            port.timeout = 0
            chunk += port.read(4 * lp.MAX_LINE)
            self.stats.bytes_received += len(chunk)
            for line in self._splitter.feed(chunk):
                if line is None:
                    raise ControllerError(f"reply to {what!r} too long")
                log.debug("received %r", line)
                try:
                    frame = lp.salvage_reply(line)
                except lp.FramingError as exc:
                    raise ControllerError(f"corrupted reply to {what!r}: {exc}") from exc
                if frame is None:
                    log.debug("discarded noise %r", line)
                    continue
                try:
                    address, payload = lp.split_address(frame.payload)
                except lp.ProtocolError as exc:
                    raise ControllerError(f"corrupted reply to {what!r}: {exc}") from exc
                if address != unit.address:
                    # Another unit's late reply (or a point-to-point reply on a bus).
                    log.debug("discarded a reply from address %s", address)
                    continue
                return payload
