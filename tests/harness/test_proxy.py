"""The fault proxy, mode by mode, with real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import AsyncIterator

import pytest

from tests.harness.proxy import FaultProxy


class Echo:
    """A server that sends back what it gets."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(1024):
                    writer.write(data)
                    await writer.drain()
            except ConnectionError:
                pass
            finally:
                writer.close()

        self._server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    echo = Echo()
    await echo.start()
    faults = await FaultProxy(("127.0.0.1", echo.port)).start()
    try:
        yield faults
    finally:
        await faults.stop()
        await echo.stop()


async def connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def test_pass_and_counts(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    writer.write(b"hello")
    assert await asyncio.wait_for(reader.readexactly(5), 2) == b"hello"
    assert proxy.stats.connections == 1
    assert proxy.stats.bytes_in == proxy.stats.bytes_out == 5
    writer.close()


async def test_delay_keeps_order_and_takes_its_time(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    proxy.delay(0.2, "in")
    started = time.monotonic()
    for part in (b"a", b"b", b"c"):
        writer.write(part)
        await writer.drain()
    assert await asyncio.wait_for(reader.readexactly(3), 2) == b"abc"
    assert time.monotonic() - started >= 0.19
    writer.close()


async def test_drop_refuses_new_connections_only(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    proxy.drop()
    new_reader, new_writer = await connect(proxy)
    with contextlib.suppress(ConnectionError):  # closed at once (reset)
        assert await asyncio.wait_for(new_reader.read(10), 2) == b""
    writer.write(b"old")
    assert await asyncio.wait_for(reader.readexactly(3), 2) == b"old"
    assert proxy.stats.refused == 1
    writer.close()
    new_writer.close()


async def test_blackhole_holds_everything_then_lets_it_through(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    proxy.blackhole()
    writer.write(b"held")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(4), 0.3)
    assert not writer.is_closing() and proxy.open_connections == 1
    proxy.set_pass()
    assert await asyncio.wait_for(reader.readexactly(4), 2) == b"held"
    writer.close()


async def test_cut_resets_open_connections_then_passes(proxy: FaultProxy) -> None:
    reader, writer = await connect(proxy)
    writer.write(b"x")
    assert await asyncio.wait_for(reader.readexactly(1), 2) == b"x"  # through the proxy
    proxy.cut()
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(reader.readexactly(1), 2)
    reader, writer = await connect(proxy)
    writer.write(b"again")
    assert await asyncio.wait_for(reader.readexactly(5), 2) == b"again"
    writer.close()


async def test_blackhole_drops_what_a_side_sent_before_it_reset(proxy: FaultProxy) -> None:
    """A TCP stack that resets a connection drops what the peer has not acknowledged: the
    held bytes of a client that reset never reach the broker, even once the link heals."""
    _, writer = await connect(proxy)
    await proxy.wait_for(lambda: proxy.open_connections == 1)
    proxy.blackhole()
    writer.write(b"stale write")
    await writer.drain()
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
    await proxy.wait_for(lambda: proxy.stats.resets > 0)  # the proxy has seen the reset
    proxy.set_pass()  # the link heals
    await proxy.wait_for(lambda: proxy.open_connections == 0)
    assert proxy.stats.bytes_in == 0
