"""The fake controller: the line protocol over a thermal model, on a pty and/or TCP,
with a front panel for local changes and injected faults.

DeviceCore, Faults and parse_panel_command are pure; FakeDevice puts them on the wire.
Beside the contract's panel commands the fake understands, for tests:
`FAULT STRAY <n>` (line noise before the next n replies), `FAULT BADSUM <n>` and
`FAULT NOSUM <n>` (wrong or missing checksum on the next n replies).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, fields
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from agent.controller import line_protocol as lp
from agent.controller.interface import (
    DEFAULT_LIMITS,
    ControllerState,
    DeviceIdentity,
    Limits,
    round_to_step,
)
from agent.controller.ptys import RawPty, point_link, remove_link
from agent.controller.thermal_model import ThermalModel

log = logging.getLogger(__name__)

DEFAULT_IDENTITY = DeviceIdentity("SIM-TSTAT", "1.0.0", "SIM0001")
STRAY_NOISE = b"\x00\xff\x13 \r\n\xfe~#"
"""Line noise: a line of control bytes, then a printable prefix on the reply's line."""

_HAS_CHECKSUM = re.compile(rb".*\*[0-9A-Fa-f]{2}")


@dataclass(frozen=True, slots=True)
class WriteRecord:
    """A SET SP the device received (on its line, or PANEL SP at the panel)."""

    at: float
    """time.monotonic() at the device when it processed the request."""
    value: float
    stored: float | None
    """The value stored, rounded to the step; None if refused (out of range)."""
    channel: str


@dataclass(frozen=True, slots=True)
class RequestRecord:
    at: float
    channel: str
    line: bytes


# --- pure device behaviour -------------------------------------------------------------


class DeviceCore:
    """What the fake controller answers, given the time. No I/O."""

    def __init__(
        self,
        *,
        now: float,
        setpoint: float = 20.0,
        temperature: float = 18.0,
        limits: Limits = DEFAULT_LIMITS,
        time_constant_s: float = 60.0,
        identity: DeviceIdentity = DEFAULT_IDENTITY,
    ) -> None:
        self.limits = limits
        self.identity = identity
        self.model = ThermalModel(
            setpoint=round_to_step(setpoint, limits),
            temperature=temperature,
            now=now,
            time_constant_s=time_constant_s,
        )
        self.writes: list[WriteRecord] = []
        self.panel_changes: list[WriteRecord] = []

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
        (self.panel_changes if channel == "panel" else self.writes).append(record)
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

    def respond(self, line: bytes, now: float, channel: str = "device") -> bytes | None:
        """The reply line to one request line; None for a blank line.

        A checksummed request gets a checksummed reply; one without, a reply without.
        """
        frame_or_reply = decode_request(line)
        if frame_or_reply is None:
            return None
        if isinstance(frame_or_reply, bytes):
            return frame_or_reply
        try:
            reply = self.answer(lp.parse_request(frame_or_reply.payload), now, channel)
        except lp.RequestError as exc:
            reply = lp.ErrorReply(exc.code)
        return lp.encode_line(lp.format_reply(reply), with_checksum=frame_or_reply.checksummed)


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


@dataclass
class Faults:
    """The faults in force at the device line. Pure: times are passed in."""

    unplugged_until: float | None = None
    silent_until: float | None = None
    slow_s: float = 0.0
    garbage: int = 0
    stray: int = 0
    bad_checksum: int = 0
    no_checksum: int = 0

    def silent(self, now: float) -> bool:
        return self.silent_until is not None and now < self.silent_until

    def clear(self) -> None:
        for spec in fields(self):
            setattr(self, spec.name, spec.default)

    def mangle(self, reply: bytes) -> bytes:
        """Apply the counted faults to one reply, using one count of each."""
        if self.no_checksum > 0:
            self.no_checksum -= 1
            content = reply.rstrip(b"\r\n")
            if _HAS_CHECKSUM.fullmatch(content):
                reply = content[:-3] + lp.TERMINATOR
        if self.bad_checksum > 0:
            self.bad_checksum -= 1
            content = reply.rstrip(b"\r\n")
            if _HAS_CHECKSUM.fullmatch(content):
                wrong = int(content[-2:], 16) ^ 0x5A
                reply = content[:-2] + b"%02X" % wrong + lp.TERMINATOR
        if self.garbage > 0:
            self.garbage -= 1
            reply = corrupt(reply)
        if self.stray > 0:
            self.stray -= 1
            reply = STRAY_NOISE + reply
        return reply


@dataclass(frozen=True, slots=True)
class PanelSetpoint:
    value: float


@dataclass(frozen=True, slots=True)
class FaultCommand:
    kind: str
    """UNPLUG, SILENT (seconds), SLOW (ms), GARBAGE, STRAY, BADSUM, NOSUM (count), CLEAR."""
    amount: float = 0.0


_FAULT_UNITS = {
    "UNPLUG": "seconds",
    "SILENT": "seconds",
    "SLOW": "ms",
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


# --- the device on the wire ------------------------------------------------------------


class _PtyEndpoint:
    """The device line on one pty, served request by request."""

    def __init__(self, device: FakeDevice, link: Path) -> None:
        self.device = device
        self.link = link
        self.pty = RawPty()
        self.splitter = lp.LineSplitter()
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        loop.add_reader(self.pty.master, self._readable)
        self.task = asyncio.create_task(self._serve(), name=f"fake-device-pty {link.name}")
        point_link(link, self.pty.slave_name)

    def _readable(self) -> None:
        try:
            data = os.read(self.pty.master, 4096)
        except BlockingIOError:
            return
        except OSError as exc:
            log.debug("pty read: %s", exc)
            return
        for line in self.splitter.feed(data):
            self.queue.put_nowait(line)

    async def _serve(self) -> None:
        while True:
            line = await self.queue.get()
            reply = await self.device._serve_line(line, "pty")
            if reply is None:
                continue
            try:
                os.write(self.pty.master, reply)
            except OSError as exc:  # nobody reading and the buffer full: the reply is lost
                log.debug("pty write: %s", exc)

    async def close(self) -> None:
        """The adapter is gone: the link disappears and an open port reads EIO."""
        asyncio.get_running_loop().remove_reader(self.pty.master)
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        remove_link(self.link, self.pty.slave_name)
        self.pty.close()


class FakeDevice:
    """The fake controller, in-process. Start it with start(), stop it with stop().

    `writes` lists every SET SP received on the device line with its time, for tests.
    """

    def __init__(
        self,
        *,
        setpoint: float = 20.0,
        temperature: float = 18.0,
        limits: Limits = DEFAULT_LIMITS,
        time_constant_s: float = 60.0,
        identity: DeviceIdentity = DEFAULT_IDENTITY,
        host: str = "127.0.0.1",
        emulate_baud: int | None = None,
    ) -> None:
        self.core = DeviceCore(
            now=time.monotonic(),
            setpoint=setpoint,
            temperature=temperature,
            limits=limits,
            time_constant_s=time_constant_s,
            identity=identity,
        )
        self.faults = Faults()
        self.host = host
        self.emulate_baud = emulate_baud
        """If set, each reply is delayed by the line time of request and reply."""
        self.requests: list[RequestRecord] = []
        self.plug_count = 0
        """How often the device came back after FAULT UNPLUG."""
        self._changed = asyncio.Event()
        self._pty_link: Path | None = None
        self._pty: _PtyEndpoint | None = None
        self._tcp_port: int | None = None
        self._tcp_server: asyncio.Server | None = None
        self._tcp_writers: set[asyncio.StreamWriter] = set()
        self._panel_server: asyncio.Server | None = None
        self._panel_writers: set[asyncio.StreamWriter] = set()
        self._panel_port: int | None = None
        self._replug: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False

    # --- lifecycle --------------------------------------------------------------------

    async def start(
        self,
        *,
        pty_link: str | Path | None = None,
        tcp_port: int | None = None,
        panel_port: int | None = None,
    ) -> Self:
        """Serve the device line on a pty (symlink at pty_link) and/or TCP, and the
        panel on TCP. Port 0 picks a free port."""
        if pty_link is None and tcp_port is None:
            raise ValueError("give the device a pty link, a TCP port, or both")
        self._changed = asyncio.Event()
        self._started = True
        try:
            if pty_link is not None:
                self._attach_pty(pty_link)
            if tcp_port is not None:
                self._tcp_port = tcp_port
                await self._listen_tcp()
            if panel_port is not None:
                self._panel_server = await asyncio.start_server(
                    self._panel_client, self.host, panel_port
                )
                self._panel_port = self._panel_server.sockets[0].getsockname()[1]
        except BaseException:
            await self.stop()
            raise
        return self

    def _attach_pty(self, link: str | Path) -> None:
        # Creating a pty and a symlink are quick local calls, fine on the loop.
        self._pty_link = Path(link).absolute()
        self._pty = _PtyEndpoint(self, self._pty_link)

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self._replug is not None:
            self._replug.cancel()
            self._replug = None
        for task in list(self._tasks):
            task.cancel()
        await self._unplug()
        if self._panel_server is not None:
            self._panel_server.close()
            self._panel_server = None
        for writer in list(self._panel_writers):
            writer.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _listen_tcp(self) -> None:
        assert self._tcp_port is not None
        self._tcp_server = await asyncio.start_server(self._tcp_client, self.host, self._tcp_port)
        # Keep the port picked for 0: after an unplug the device comes back on it.
        self._tcp_port = self._tcp_server.sockets[0].getsockname()[1]

    async def _unplug(self) -> None:
        if self._pty is not None:
            await self._pty.close()
            self._pty = None
        if self._tcp_server is not None:
            self._tcp_server.close()
            self._tcp_server = None
        for writer in list(self._tcp_writers):
            writer.close()
        self._tcp_writers.clear()
        self._notify()

    async def _plug(self) -> None:
        self._replug = None
        self.faults.unplugged_until = None
        if not self._started:
            return
        try:
            if self._pty_link is not None and self._pty is None:
                self._pty = _PtyEndpoint(self, self._pty_link)
            if self._tcp_port is not None and self._tcp_server is None:
                await self._listen_tcp()
        except OSError:
            log.exception("fake device: could not come back")
            return
        self.plug_count += 1
        log.info("fake device: plugged in again")
        self._notify()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- endpoints --------------------------------------------------------------------

    @property
    def pty_link(self) -> str | None:
        """The device path to open (a symlink to the current pty)."""
        return None if self._pty_link is None else str(self._pty_link)

    @property
    def tcp_url(self) -> str | None:
        return None if self._tcp_port is None else f"socket://{self.host}:{self._tcp_port}"

    @property
    def panel_url(self) -> str | None:
        return None if self._panel_port is None else f"tcp://{self.host}:{self._panel_port}"

    @property
    def panel_address(self) -> tuple[str, int] | None:
        return None if self._panel_port is None else (self.host, self._panel_port)

    def ready_line(self) -> str:
        """`device <url> [device <url>] [panel <url>]`, as sim-device prints it."""
        words: list[str] = []
        for url in (self.pty_link, self.tcp_url):
            if url is not None:
                words += ["device", url]
        if self.panel_url is not None:
            words += ["panel", self.panel_url]
        return " ".join(words)

    # --- what tests look at -----------------------------------------------------------

    @property
    def writes(self) -> list[WriteRecord]:
        return self.core.writes

    @property
    def setpoint(self) -> float:
        return self.core.model.setpoint

    @property
    def unplugged(self) -> bool:
        return self.faults.unplugged_until is not None

    def state(self) -> ControllerState:
        return self.core.state(time.monotonic())

    def _notify(self) -> None:
        # Wake every waiter; each waits on the event current when it last looked.
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
        """Wait until predicate() holds; it is checked after every request and change."""
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await self._changed.wait()

    # --- panel and faults (also callable in-process) ----------------------------------

    def panel_setpoint(self, value: float) -> lp.Reply:
        """A person sets the set point at the device."""
        reply = self.core.store_setpoint(value, time.monotonic(), "panel")
        self._notify()
        return reply

    def fault(self, kind: str, amount: float = 0.0) -> None:
        now = time.monotonic()
        kind = kind.upper()
        if kind == "CLEAR":
            was_unplugged = self.unplugged
            self.faults.clear()
            if was_unplugged and self._replug is not None:
                self._replug.cancel()
                self._spawn(self._plug())
        elif kind == "UNPLUG":
            self.faults.unplugged_until = now + amount
            log.info("fake device: unplugged for %s s", amount)
            self._spawn(self._unplug())
            if self._replug is not None:
                self._replug.cancel()
            self._replug = asyncio.get_running_loop().call_later(
                amount, lambda: self._spawn(self._plug())
            )
        elif kind == "SILENT":
            self.faults.silent_until = now + amount
        elif kind == "SLOW":
            self.faults.slow_s = amount / 1000
        elif kind == "GARBAGE":
            self.faults.garbage = int(amount)
        elif kind == "STRAY":
            self.faults.stray = int(amount)
        elif kind == "BADSUM":
            self.faults.bad_checksum = int(amount)
        elif kind == "NOSUM":
            self.faults.no_checksum = int(amount)
        else:
            raise ValueError(f"unknown fault {kind!r}")
        self._notify()

    # --- serving ----------------------------------------------------------------------

    async def _serve_line(self, line: bytes | None, channel: str) -> bytes | None:
        """The reply to one line from the device line, after faults and delays."""
        now = time.monotonic()
        if line is not None and line.strip():
            self.requests.append(RequestRecord(now, channel, line))
        if self.faults.silent(now):
            self._notify()
            return None
        if line is None:
            reply: bytes | None = lp.encode_line("ERR SYNTAX", with_checksum=False)
        else:
            reply = self.core.respond(line, now, channel)
        self._notify()
        if reply is None:
            return None
        reply = self.faults.mangle(reply)
        delay = self.faults.slow_s
        if self.emulate_baud:
            request_len = len(line or b"") + len(lp.TERMINATOR)
            delay += (request_len + len(reply)) * 10 / self.emulate_baud
        if delay > 0:
            await asyncio.sleep(delay)
        return reply

    async def _tcp_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.unplugged:
            writer.close()
            return
        self._tcp_writers.add(writer)
        splitter = lp.LineSplitter()
        try:
            while data := await reader.read(4096):
                for line in splitter.feed(data):
                    reply = await self._serve_line(line, "tcp")
                    if reply is not None and not writer.is_closing():
                        writer.write(reply)
                        await writer.drain()
        except (ConnectionError, OSError) as exc:
            log.debug("fake device: TCP client gone: %s", exc)
        finally:
            self._tcp_writers.discard(writer)
            writer.close()

    def _panel_reply(self, line: bytes | None) -> bytes | None:
        if line is None:
            return lp.encode_line("ERR SYNTAX", with_checksum=False)
        decoded = decode_request(line)
        if decoded is None or isinstance(decoded, bytes):
            return decoded
        reply: lp.Reply
        try:
            command = parse_panel_command(decoded.payload)
            if command is None:
                reply = self.core.answer(
                    lp.parse_request(decoded.payload), time.monotonic(), "panel"
                )
                self._notify()
            elif isinstance(command, PanelSetpoint):
                reply = self.panel_setpoint(command.value)
            else:
                self.fault(command.kind, command.amount)
                reply = lp.OkReply()
        except lp.RequestError as exc:
            reply = lp.ErrorReply(exc.code)
        return lp.encode_line(lp.format_reply(reply), with_checksum=decoded.checksummed)

    async def _panel_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._panel_writers.add(writer)
        splitter = lp.LineSplitter()
        try:
            while data := await reader.read(4096):
                for line in splitter.feed(data):
                    reply = self._panel_reply(line)
                    if reply is not None:
                        writer.write(reply)
                        await writer.drain()
        except (ConnectionError, OSError) as exc:
            log.debug("fake device: panel client gone: %s", exc)
        finally:
            self._panel_writers.discard(writer)
            writer.close()


async def start_fake_device(
    *,
    pty_link: str | Path | None = None,
    tcp_port: int | None = None,
    panel_port: int | None = None,
    **options: object,
) -> FakeDevice:
    """Create and start a fake device (options as for FakeDevice)."""
    device = FakeDevice(**options)  # type: ignore[arg-type]
    return await device.start(pty_link=pty_link, tcp_port=tcp_port, panel_port=panel_port)
