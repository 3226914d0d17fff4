"""One serial port through pyserial, as the drivers use it: opened, written with a bound,
read against deadlines, closed, or aborted so that nothing queued goes out late.

Any pyserial URL works: a device path (/dev/ttyUSB0, /dev/serial/by-id/...), opened
exclusively; socket://host:port and rfc2217://host:port for serial device servers.
Blocking; called from the bus's thread only.

pyserial (pinned at 3.5) opens, configures, flushes and closes the port. A tty's and a
socket://'s bytes are read and written here, on its descriptor (`fd`, `_socket`): one wait
and one system call where pyserial's loops take several a frame (a read of what has come,
then another that finds nothing), and a write whose bytes all went out is never a timeout
(pyserial's raises one when its thread was kept off the CPU past the write timeout, after
the bytes went out, and looks again for room it no longer needs). What a read takes past the
bytes asked for is kept for the next (`_ahead`): a reply's header and body are one read.
RFC 2217 goes through pyserial, with a read's timeout set on the port's `_timeout` rather
than through the `timeout` property, whose setter reconfigures the port (a round of RFC 2217
negotiation with the serial device server) on every read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import struct
import termios
import time
from collections.abc import Callable
from typing import Any

import serial  # type: ignore[import-untyped]

from agent.controller.driver import (
    WRITE_TIMEOUT_S,
    GateClosed,
    LinkLost,
    LinkStats,
    is_device_path,
)

log = logging.getLogger(__name__)

# What pyserial raises when the port goes away: SerialException (an OSError), a bare
# OSError from os.read/ioctl, or termios.error from tcflush on a hung-up tty.
PORT_ERRORS = (serial.SerialException, OSError, termios.error)


class SerialPort:
    def __init__(self, url: str, stats: LinkStats, **settings: Any) -> None:
        self.url = url
        self.stats = stats
        self.rfc2217 = url.startswith("rfc2217://")
        # pyserial's RFC 2217 client has no write timeout: its socket's is set instead.
        self._settings = dict(settings, write_timeout=None if self.rfc2217 else WRITE_TIMEOUT_S)
        if is_device_path(url):
            self._settings.setdefault("exclusive", True)
        else:
            self._settings.pop("exclusive", None)  # a flock() on a tty; URLs have none
        self.exclusive = bool(self._settings.get("exclusive", False))
        # Catch a bad URL scheme, baud rate or parity now rather than retry it forever.
        serial.serial_for_url(url, do_not_open=True, **self._settings)
        self._port: serial.Serial | None = None
        self._fd: int | None = None
        """The open port's descriptor, read and written here (None: through pyserial)."""
        self._socket: socket.socket | None = None
        """socket://'s socket (its descriptor is `_fd`)."""
        self._ahead = bytearray()
        """Bytes read past what the last read asked for."""

    @property
    def is_open(self) -> bool:
        return self._port is not None

    def fileno(self) -> int | None:
        """The open port's descriptor (a tty), for tests that look at it."""
        return None if self._port is None else self._port.fileno()

    def open(self) -> None:
        self.close()
        try:
            self._port = serial.serial_for_url(self.url, **self._settings)
        except PORT_ERRORS as exc:
            raise LinkLost(f"cannot open {self.url}: {exc}") from exc
        sock = getattr(self._port, "_socket", None)
        if sock is not None:
            # A request goes out at once: with Nagle's algorithm, one sent after a request
            # that got no reply waits for that one's delayed ACK (up to 40 ms), longer than
            # a short reply timeout.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.rfc2217 and sock is not None:
            sock.settimeout(WRITE_TIMEOUT_S)  # its reader thread takes a timeout in stride
        elif sock is not None:  # socket://: pyserial made it non-blocking
            self._socket, self._fd = sock, sock.fileno()
        elif isinstance(getattr(self._port, "fd", None), int):  # a tty, opened O_NONBLOCK
            self._fd = self._port.fd
        log.debug("opened %s", self.url)

    def close(self) -> None:
        port, self._port = self._port, None
        self._fd, self._socket = None, None
        self._ahead.clear()
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

    def abort(self) -> None:
        """Closes the port dropping what it still holds to send: a socket is reset (RST,
        no retransmission of queued bytes), a tty's output queue is flushed."""
        port = self._port
        if port is None:
            return
        sock = getattr(port, "_socket", None)
        with contextlib.suppress(OSError, AttributeError):
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                port.reset_output_buffer()
        self.close()

    def _open_port(self) -> serial.Serial:
        if self._port is None:
            raise LinkLost("port is not open")
        return self._port

    def discard_input(self) -> None:
        port = self._open_port()
        try:
            if self.rfc2217:
                # Its reset_input_buffer() asks the server to purge and polls for the
                # answer every 50 ms: what is stale here is what has come in already.
                port._timeout = 0
                while port.read(4096):
                    pass
            else:
                port.reset_input_buffer()
        except PORT_ERRORS as exc:
            raise LinkLost(str(exc)) from exc
        self._ahead.clear()

    def send(self, frame: bytes, last_look: Callable[[], bool] | None = None) -> None:
        """Writes `frame` within WRITE_TIMEOUT_S, or aborts the port (LinkLost).
        `last_look()` is asked right before the write (GateClosed when it says no)."""
        port = self._open_port()
        if last_look is not None and not last_look():
            raise GateClosed(f"{self.url}: not sent (the lease ended before the first byte)")
        try:
            if self._fd is None:
                port.write(frame)
            else:
                self._write_all(self._fd, frame)
        except serial.SerialTimeoutException as exc:
            self.abort()
            raise LinkLost(f"{self.url}: a write did not go out in {WRITE_TIMEOUT_S} s") from exc
        except PORT_ERRORS as exc:
            self.abort()  # what it left queued must not go out later
            raise LinkLost(str(exc)) from exc
        self.stats.transactions += 1
        self.stats.bytes_sent += len(frame)

    def _write_all(self, fd: int, frame: bytes) -> None:
        """All of `frame` handed to the descriptor; a timeout only when some of it still
        finds no room WRITE_TIMEOUT_S after the start."""
        give_up = time.monotonic() + WRITE_TIMEOUT_S
        rest = memoryview(frame)
        while True:
            with contextlib.suppress(BlockingIOError):
                sent = self._socket.send(rest) if self._socket is not None else os.write(fd, rest)
                rest = rest[sent:]
            if not rest:
                return
            left = give_up - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise serial.SerialTimeoutException("write timeout")

    def _read_fd(self, fd: int, size: int, deadline: float) -> bytes:
        if not self._ahead:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return b""
            try:
                chunk = self._socket.recv(4096) if self._socket is not None else os.read(fd, 4096)
            except BlockingIOError:  # woken with nothing to read after all
                return b""
            if not chunk:
                raise LinkLost(f"{self.url}: readable, but nothing came (disconnected?)")
            self._ahead += chunk
        taken = bytes(self._ahead[:size])
        del self._ahead[:size]
        return taken

    def read(self, size: int, deadline: float) -> bytes:
        """Up to `size` bytes: waits for the first until `deadline` (monotonic), then takes
        what has come without waiting. b"" when nothing came in time."""
        port = self._open_port()
        if self._fd is not None:
            try:
                chunk = self._read_fd(self._fd, size, deadline)
            except PORT_ERRORS as exc:
                raise LinkLost(str(exc)) from exc
            self.stats.bytes_received += len(chunk)
            return chunk
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b""
            port._timeout = remaining
            chunk: bytes = port.read(1)
            if not chunk:
                return b""
            if size > 1:
                # Whatever else has come, without waiting: a byte at a time (in_waiting
                # says 1 on socket://) would cost a system call each.
                port._timeout = 0
                chunk += port.read(size - 1)
        except PORT_ERRORS as exc:
            raise LinkLost(str(exc)) from exc
        self.stats.bytes_received += len(chunk)
        return chunk

    def wait_for_quiet(self, quiet_s: float, at_most_s: float) -> int:
        """Discards input until the line has been quiet for `quiet_s` (giving up after
        `at_most_s`): the bytes discarded."""
        give_up = time.monotonic() + at_most_s
        discarded = 0
        while time.monotonic() < give_up:
            chunk = self.read(4096, min(give_up, time.monotonic() + quiet_s))
            if not chunk:
                break
            discarded += len(chunk)
        return discarded

    def read_exactly(self, size: int, first_by: float, gap_s: float) -> bytes:
        """`size` bytes: the first by `first_by` (monotonic), each further one within
        `gap_s` of the one before (the inter-character timeout). Fewer when the line went
        quiet first (b"" when nothing came)."""
        data = self.read(size, first_by)
        while data and len(data) < size:
            more = self.read(size - len(data), time.monotonic() + gap_s)
            if not more:
                break
            data += more
        return data
