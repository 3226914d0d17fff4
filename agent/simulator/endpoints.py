"""Where the fake line meets the wire: its pty, its TCP server (a serial device server that
several clients may share, raw or speaking RFC 2217) and its front panel on TCP.

Each endpoint splits what a client sends into requests and hands them to the line one at
a time (FakeLine.transact), which answers them in turn across all clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol, Self

from agent.controller import line_protocol as lp
from agent.simulator.ptys import RawPty, point_link, remove_link
from agent.simulator.wires import Wire

log = logging.getLogger(__name__)

PTY_QUEUE = 256
"""Requests read from the pty and not yet served; more are dropped, as a UART overruns."""

PTY_CLIENT = "pty"

CLOSE_TIMEOUT_S = 1.0


class Overruns(Protocol):
    overruns: int


class ServedLine(Protocol):
    """What an endpoint needs of the line it serves (`line.FakeLine` is one): what the
    bytes mean, one transaction at a time, the front panel's answers."""

    @property
    def wire(self) -> Wire: ...

    @property
    def counters(self) -> Overruns: ...

    @property
    def unplugged(self) -> bool: ...

    def connection_id(self, port: str = "tcp") -> str: ...

    def transact(
        self, client: str, channel: str, frame: bytes | None, send: Callable[[bytes], None]
    ) -> Awaitable[None]: ...

    def panel_reply(self, line: bytes | None) -> bytes | None: ...


class PtyEndpoint:
    """The device line on one pty, served request by request."""

    def __init__(self, line: ServedLine, link: Path) -> None:
        self.line = line
        self.link = link
        self.pty = RawPty()
        self.splitter = line.wire.splitter()
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(PTY_QUEUE)
        loop = asyncio.get_running_loop()
        loop.add_reader(self.pty.master, self._readable)
        self.task = asyncio.create_task(self._serve(), name=f"fake-line-pty {link.name}")
        point_link(link, self.pty.slave_name)

    def _readable(self) -> None:
        try:
            data = os.read(self.pty.master, 4096)
        except BlockingIOError:
            return
        except OSError as exc:
            log.debug("pty read: %s", exc)
            return
        for frame in self.splitter.feed(data):
            try:
                self.queue.put_nowait(frame)
            except asyncio.QueueFull:
                self.line.counters.overruns += 1

    def _send(self, reply: bytes) -> None:
        try:
            os.write(self.pty.master, reply)
        except OSError as exc:  # nobody reading and the buffer full: the reply is lost
            log.debug("pty write: %s", exc)

    async def _serve(self) -> None:
        while True:
            frame = await self.queue.get()
            await self.line.transact(PTY_CLIENT, "pty", frame, self._send)

    async def close(self) -> None:
        """The adapter is gone: the link disappears and an open port reads EIO."""
        asyncio.get_running_loop().remove_reader(self.pty.master)
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        remove_link(self.link, self.pty.slave_name)
        self.pty.close()


class _TcpServer:
    """A TCP server of the line; each connection is served by `_client`."""

    def __init__(self, line: ServedLine, server: asyncio.Server, name: str = "tcp") -> None:
        self.line = line
        self.name = name
        """Names the port's connections in the line's records (`<name>-<n>`)."""
        self.server = server
        self.port: int = server.sockets[0].getsockname()[1]
        self.writers: set[asyncio.StreamWriter] = set()
        self.handlers: set[asyncio.Task[object]] = set()

    @classmethod
    async def listen(cls, line: ServedLine, host: str, port: int, name: str = "tcp") -> Self:
        endpoint: Self | None = None

        async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert endpoint is not None
            handler = asyncio.current_task()
            assert handler is not None
            endpoint.handlers.add(handler)
            try:
                await endpoint._client(reader, writer)
            finally:
                endpoint.handlers.discard(handler)

        server = await asyncio.start_server(client, host, port)
        endpoint = cls(line, server, name)
        return endpoint

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Stop listening, drop every connection, and let their handlers end (within a
        second: one may be in the middle of a transaction); a handler cancelled on the
        way out of the program would be reported as an error by asyncio."""
        self.server.close()
        for writer in list(self.writers):
            writer.close()
        self.writers.clear()
        if self.handlers:
            await asyncio.wait(list(self.handlers), timeout=CLOSE_TIMEOUT_S)


class TcpEndpoint(_TcpServer):
    """The device line on TCP, raw bytes as a serial device server passes them; every
    connection is a client of the one line."""

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.line.unplugged:
            writer.close()
            return
        self.writers.add(writer)
        client = self.line.connection_id(self.name)
        splitter = self.line.wire.splitter()

        def send(reply: bytes) -> None:
            if not writer.is_closing():
                writer.write(reply)

        try:
            while data := await reader.read(4096):
                for frame in splitter.feed(data):
                    await self.line.transact(client, "tcp", frame, send)
                    await writer.drain()
        except (ConnectionError, OSError) as exc:
            log.debug("fake line: TCP client %s gone: %s", client, exc)
        finally:
            self.writers.discard(writer)
            writer.close()


class PanelEndpoint(_TcpServer):
    """The front panel: the line protocol plus PANEL and FAULT commands, on TCP."""

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        splitter = lp.LineSplitter()
        try:
            while data := await reader.read(4096):
                for line in splitter.feed(data):
                    reply = self.line.panel_reply(line)
                    if reply is not None:
                        writer.write(reply)
                        await writer.drain()
        except (ConnectionError, OSError) as exc:
            log.debug("fake line: panel client gone: %s", exc)
        finally:
            self.writers.discard(writer)
            writer.close()


class _PortSettings:
    """What an RFC 2217 client may set and read of the "serial port" behind the server:
    kept, and reported back; the line itself runs at whatever rate it emulates."""

    def __init__(self) -> None:
        self.baudrate = 9600
        self.bytesize = 8
        self.parity = "N"
        self.stopbits = 1
        self.rtscts = False
        self.xonxoff = False
        self.rts = True
        self.dtr = True
        self.break_condition = False
        self.cts = True
        self.dsr = True
        self.ri = False
        self.cd = True

    def reset_input_buffer(self) -> None:
        """Nothing is buffered: requests go to the line as they come."""

    def reset_output_buffer(self) -> None:
        """Nothing is buffered: replies are sent as they are made."""


class Rfc2217Endpoint(_TcpServer):
    """The device line on TCP as a serial device server speaking RFC 2217 (Telnet COM port
    control, what `rfc2217://` URLs expect): the port's settings are negotiated, the data
    is Telnet-escaped both ways."""

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from serial.rfc2217 import PortManager  # type: ignore[import-untyped]

        if self.line.unplugged:
            writer.close()
            return
        self.writers.add(writer)
        client = self.line.connection_id(self.name)
        splitter = self.line.wire.splitter()

        class Connection:
            @staticmethod
            def write(data: bytes) -> None:
                if not writer.is_closing():
                    writer.write(data)

        manager = PortManager(_PortSettings(), Connection())

        def send(reply: bytes) -> None:
            Connection.write(b"".join(manager.escape(reply)))

        try:
            while data := await reader.read(4096):
                payload = b"".join(manager.filter(data))
                for frame in splitter.feed(payload):
                    await self.line.transact(client, "rfc2217", frame, send)
                await writer.drain()
        except (ConnectionError, OSError) as exc:
            log.debug("fake line: RFC 2217 client %s gone: %s", client, exc)
        finally:
            self.writers.discard(writer)
            writer.close()
