"""A TCP fault proxy between a client (an agent) and its broker, on loopback.

Controlled while traffic flows, from the event loop it runs in:

- `set_pass()`: bytes go through as they come.
- `delay(seconds, direction="both")`: each chunk is held for a fixed one-way delay, in
  order ("in": towards the broker, "out": towards the client).
- `drop()`: new connections are closed at once (a refusing broker); open ones go on.
- `blackhole(direction="both")`: a half-open link: bytes are accepted from both sides and
  forwarded nowhere (or only those going one way: "in" towards the broker, "out" towards
  the client), and nothing is closed. When it ends, what was held goes through, as TCP would
  retransmit it over a link that came back (a peer that gave up meanwhile has closed),
  except what a side sent before it reset its connection (RST drops it).
- `cut()`: every open connection is reset (RST), then the proxy passes again.

It counts connections and bytes each way.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class ProxyStats:
    connections: int = 0
    refused: int = 0
    bytes_in: int = 0  # client -> broker
    bytes_out: int = 0  # broker -> client
    resets: int = 0  # connections reset by either side
    connected_at: list[float] = field(default_factory=list)


class FaultProxy:
    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = target
        self.host = host
        self._requested_port = port
        self.port = 0
        self.mode = "pass"
        self.delays = {"in": 0.0, "out": 0.0}
        self.stats = ProxyStats()
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = {"in": asyncio.Event(), "out": asyncio.Event()}
        for flowing in self._flowing.values():
            flowing.set()
        self._changed = asyncio.Event()  # replaced by a fresh one at each change

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self._requested_port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._reset_all()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ control

    def set_pass(self) -> None:
        self.mode = "pass"
        self.delays = {"in": 0.0, "out": 0.0}
        for flowing in self._flowing.values():
            flowing.set()

    def delay(self, seconds: float, direction: str = "both") -> None:
        self.mode = "pass"
        for side in ("in", "out"):
            if direction in (side, "both"):
                self.delays[side] = seconds

    def drop(self) -> None:
        self.mode = "drop"
        for flowing in self._flowing.values():
            flowing.set()

    def blackhole(self, direction: str = "both") -> None:
        self.mode = "blackhole"
        for side, flowing in self._flowing.items():
            if direction in (side, "both"):
                flowing.clear()

    def cut(self) -> None:
        self._reset_all()
        self.set_pass()

    @property
    def open_connections(self) -> int:
        return len(self._pairs)

    async def wait_for(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Until `condition` (of `stats` or `open_connections`) holds, checked at each change."""
        async with asyncio.timeout(timeout):
            while not condition():
                await self._changed.wait()

    def _note_change(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # ------------------------------------------------------------------ the connections

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "drop":
            self.stats.refused += 1
            self._note_change()
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            self.stats.refused += 1
            self._note_change()
            _reset(writer)
            return
        for stream in (writer, up_writer):
            sock = stream.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stats.connections += 1
        self.stats.connected_at.append(time.monotonic())
        pair = (writer, up_writer)
        self._pairs.add(pair)
        self._note_change()
        forward = self._spawn(self._pump(reader, up_writer, "in"))
        backward = self._spawn(self._pump(up_reader, writer, "out"))
        await asyncio.gather(forward, backward, return_exceptions=True)
        self._pairs.discard(pair)
        self._note_change()
        for stream in pair:
            stream.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, side: str
    ) -> None:
        # Chunks due at a time: a delayed link keeps their order.
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(maxsize=10_000)
        discarded = asyncio.Event()  # reset by its sender while held: never delivered
        sender = self._spawn(self._send(queue, writer, side, discarded))
        try:
            while data := await reader.read(65536):
                await queue.put((time.monotonic() + self.delays[side], data))
        except (ConnectionError, OSError):
            self.stats.resets += 1
            self._note_change()
            if not self._flowing[side].is_set():
                # Reset by its sender while held: a TCP stack that resets a connection
                # drops what it had not got acknowledged, so it never arrives.
                discarded.set()
                while not queue.empty():
                    queue.get_nowait()
        finally:
            await queue.put(None)
            await sender

    async def _send(
        self,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        writer: asyncio.StreamWriter,
        side: str,
        discarded: asyncio.Event,
    ) -> None:
        try:
            while (item := await queue.get()) is not None:
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._flowing[side].wait()  # held while the link is a black hole
                if discarded.is_set():
                    break
                writer.write(data)
                if side == "in":
                    self.stats.bytes_in += len(data)
                else:
                    self.stats.bytes_out += len(data)
                self._note_change()
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if writer.can_write_eof() and not writer.is_closing():
                with contextlib.suppress(OSError):
                    writer.write_eof()

    def _reset_all(self) -> None:
        for client, upstream in list(self._pairs):
            _reset(client)
            _reset(upstream)
        self._pairs.clear()

    def _spawn(self, coroutine: object) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _reset(writer: asyncio.StreamWriter) -> None:
    """Closes with RST (SO_LINGER 0), as a cut link looks to the other side."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
