"""The line-protocol driver: the controller on a serial line, through pyserial.

Any pyserial URL works: a device path (/dev/ttyUSB0, /dev/serial/by-id/...), opened
exclusively; socket://host:port and rfc2217://host:port for serial device servers.
"""

from __future__ import annotations

import logging
import termios
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import serial  # type: ignore[import-untyped]

from agent.controller import line_protocol as lp
from agent.controller.base import (
    DEFAULT_BACKOFF_INITIAL_S,
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_MIN_WRITE_INTERVAL_S,
    BlockingPortDriver,
    LinkLost,
    SetpointRejected,
)
from agent.controller.interface import (
    AvailabilityCallback,
    ControllerError,
    ControllerState,
    ControllerUnavailable,
    DeviceIdentity,
    Limits,
)

log = logging.getLogger(__name__)

DEFAULT_REPLY_TIMEOUT_S = 0.5
"""The device answers within 200 ms; the rest is margin for a loaded gateway."""

R = TypeVar("R", bound=lp.Reply)

# What pyserial raises when the port goes away: SerialException (an OSError), a bare
# OSError from os.read/ioctl, or termios.error from tcflush on a hung-up tty.
_PORT_ERRORS = (serial.SerialException, OSError, termios.error)


@dataclass(slots=True)
class LinkStats:
    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0


def is_device_path(url: str) -> bool:
    """True for a local device path; False for a pyserial URL such as socket://."""
    return "://" not in url


class SerialController(BlockingPortDriver):
    """The controller on a serial line, speaking the ASCII line protocol."""

    def __init__(
        self,
        url: str,
        *,
        baudrate: int = 9600,
        parity: str = serial.PARITY_NONE,
        bytesize: int = serial.EIGHTBITS,
        stopbits: float = serial.STOPBITS_ONE,
        reply_timeout_s: float = DEFAULT_REPLY_TIMEOUT_S,
        min_write_interval_s: float = DEFAULT_MIN_WRITE_INTERVAL_S,
        backoff_initial_s: float = DEFAULT_BACKOFF_INITIAL_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        exclusive: bool | None = None,
        on_availability: AvailabilityCallback | None = None,
    ) -> None:
        if not url:
            raise ValueError("a serial port URL or device path is required")
        if not reply_timeout_s > 0:
            raise ValueError(f"reply_timeout_s must be > 0, not {reply_timeout_s}")
        if not baudrate > 0:
            raise ValueError(f"baudrate must be > 0, not {baudrate}")
        self.url = url
        self.reply_timeout_s = reply_timeout_s
        # Exclusive open is a flock() on a local tty; URLs have no such thing.
        self.exclusive = is_device_path(url) if exclusive is None else exclusive
        self._settings: dict[str, Any] = {
            "baudrate": baudrate,
            "parity": parity,
            "bytesize": bytesize,
            "stopbits": stopbits,
            "write_timeout": reply_timeout_s,
        }
        if is_device_path(url):
            self._settings["exclusive"] = self.exclusive
        # Catch a bad URL scheme, baud rate or parity now rather than retry it forever.
        serial.serial_for_url(url, do_not_open=True, **self._settings)
        # Start bit, data bits, parity bit, stop bits: 10 bit times a byte for 8N1.
        bits = 1 + bytesize + (parity != serial.PARITY_NONE) + stopbits
        self.line_time_per_byte_s = bits / baudrate
        # The longest a request can take in the worker: a wait for a quiet line after a
        # timeout (up to 4 reply timeouts), then its own line time, the reply timeout and
        # the longest reply. The bound on the worker call is twice that.
        max_exchange_s = 5 * reply_timeout_s + 2 * lp.MAX_LINE * self.line_time_per_byte_s
        super().__init__(
            name=f"controller {url}",
            # Opening a socket:// URL may take pyserial's own 5 s connect timeout.
            io_timeout_s=max(2 * max_exchange_s, 6.0),
            min_write_interval_s=min_write_interval_s,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            on_availability=on_availability,
        )
        self._port: serial.Serial | None = None
        self._splitter = lp.LineSplitter(max_line=4 * lp.MAX_LINE)
        self._late_reply_possible = False
        self.stats = LinkStats()
        """Requests and bytes on the line, for figures."""

    async def identify(self) -> DeviceIdentity:
        """The controller's model, firmware and serial number."""
        reply = await self._call(self._transact, lp.Identify(), lp.IdReply)
        return DeviceIdentity(reply.model, reply.firmware, reply.serial)

    # --- blocking side (worker thread) ------------------------------------------------

    def _io_open(self) -> None:
        self._io_close()
        try:
            self._port = serial.serial_for_url(self.url, **self._settings)
        except _PORT_ERRORS as exc:
            raise LinkLost(f"cannot open {self.url}: {exc}") from exc
        self._late_reply_possible = False
        log.debug("opened %s", self.url)

    def _io_close(self) -> None:
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

    def _io_read_state(self) -> ControllerState:
        return self._transact(lp.GetState(), lp.StateReply).state

    def _io_read_limits(self) -> Limits:
        return self._transact(lp.GetLimits(), lp.LimitsReply).limits

    def _io_read_setpoint(self) -> float:
        return self._transact(lp.GetSetpoint(), lp.SetpointReply).value

    def _io_read_temperature(self) -> float:
        return self._transact(lp.GetTemperature(), lp.TemperatureReply).value

    def _io_write_setpoint(self, value: float) -> float:
        return self._transact(lp.SetSetpoint(value), lp.SetpointStored).value

    def _transact(self, request: lp.Request, expected: type[R]) -> R:
        """Send one request and return its reply, of the expected type."""
        port = self._port
        if port is None:
            raise LinkLost("port is not open")
        what = lp.format_request(request)
        line = lp.encode_line(what)
        try:
            # Stale bytes (a late reply, line noise) must not be taken for this reply.
            if self._late_reply_possible:
                self._wait_for_quiet(port)
            port.reset_input_buffer()
            self._splitter.clear()
            port.write(line)
            self.stats.requests += 1
            self.stats.bytes_sent += len(line)
            log.debug("sent %r", line)
            frame = self._read_reply(port, what, len(line))
        except ControllerUnavailable:
            self._late_reply_possible = True
            raise
        except _PORT_ERRORS as exc:
            raise LinkLost(str(exc)) from exc
        try:
            reply = lp.parse_reply(frame.payload)
        except lp.ProtocolError as exc:
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

    def _read_reply(self, port: serial.Serial, what: str, sent: int) -> lp.Frame:
        # The clock starts once the request is on the wire; write() returns earlier.
        deadline = (
            time.monotonic()
            + self.reply_timeout_s
            + (sent + lp.MAX_LINE) * self.line_time_per_byte_s
        )
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ControllerUnavailable(f"no reply to {what!r} within {self.reply_timeout_s} s")
            port.timeout = remaining
            chunk = port.read(max(1, port.in_waiting))
            if not chunk:
                continue
            self.stats.bytes_received += len(chunk)
            for line in self._splitter.feed(chunk):
                if line is None:
                    raise ControllerError(f"reply to {what!r} too long")
                log.debug("received %r", line)
                try:
                    frame = lp.salvage_reply(line)
                except lp.FramingError as exc:
                    raise ControllerError(f"corrupted reply to {what!r}: {exc}") from exc
                if frame is not None:
                    return frame
                log.debug("discarded noise %r", line)
