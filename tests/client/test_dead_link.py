"""The session notices a dead link (a black hole: nothing is closed, nothing comes back)
within one keep-alive of the last packet it received, and comes back once the path does; a
request whose connection ends before its response fails then, not at its timeout."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest

from agent.client.errors import RequestTimeout, ResponseLost
from agent.client.session import Session, SessionError
from agent.client.statestore import StateStoreClient
from agent.emulator.embedded import EmbeddedStateStore
from tests.client.conftest import LogWatch, fast_settings
from tests.harness.proxy import FaultProxy
from tests.support.held_requests import hold_requests
from tests.support.ports import free_port

KEEPALIVE_S = 4


@pytest.fixture
async def store() -> AsyncIterator[EmbeddedStateStore]:
    store = EmbeddedStateStore("127.0.0.1", free_port())
    await store.start()
    try:
        yield store
    finally:
        await store.stop()


@pytest.fixture
async def proxy(store: EmbeddedStateStore) -> AsyncIterator[FaultProxy]:
    proxy = await FaultProxy(("127.0.0.1", store.port)).start()
    try:
        yield proxy
    finally:
        await proxy.stop()


async def test_a_black_holed_link_is_dropped_within_one_and_a_half_keep_alives(
    proxy: FaultProxy, log_watch: LogWatch
) -> None:
    session = Session(fast_settings(proxy.port, keepalive_s=KEEPALIVE_S), client_id="dead-link")
    lost = asyncio.Event()
    session.on_disconnect(lost.set)
    await session.start(timeout=5)
    try:
        await session.publish("dead/link", b"before")
        proxy.blackhole()
        holed_at = time.monotonic()
        # gmqtt alone waits for two keep-alives of silence, checked every half keep-alive.
        await asyncio.wait_for(lost.wait(), 1.5 * KEEPALIVE_S)
        noticed_s = time.monotonic() - holed_at
        record = await log_watch.wait_for("lost its connection")
        assert "no answer to a PINGREQ" in record.getMessage(), record.getMessage()
        assert noticed_s <= 1.5 * KEEPALIVE_S
        assert not session.connected

        proxy.set_pass()
        await session.wait_connected(timeout=10)
        await session.publish("dead/link", b"after", timeout=5)
    finally:
        await session.stop()


async def test_a_quiet_healthy_link_is_kept(proxy: FaultProxy, log_watch: LogWatch) -> None:
    pings = LogWatch()
    gmqtt_log = logging.getLogger("gmqtt.mqtt.handler")
    level = gmqtt_log.level
    gmqtt_log.addHandler(pings)
    gmqtt_log.setLevel(logging.DEBUG)
    session = Session(fast_settings(proxy.port, keepalive_s=1), client_id="quiet-link")
    lost = asyncio.Event()
    session.on_disconnect(lost.set)
    await session.start(timeout=5)
    try:
        # Nothing but keep-alive traffic: five PINGREQs, each answered by a PINGRESP.
        await pings.wait_for_count("PINGRESP", 5, within=10)
        assert session.connected and not lost.is_set()
        assert not log_watch.matching("lost its connection")
    finally:
        await session.stop()
        gmqtt_log.removeHandler(pings)
        gmqtt_log.setLevel(level)


async def test_a_dropped_link_never_delivers_what_it_held(proxy: FaultProxy) -> None:
    """drop_link() resets the connection: a message held by a partition is dropped with it,
    not delivered when the path comes back; the session reconnects by itself."""
    watcher = Session(fast_settings(proxy.target[1]), client_id="watcher")
    await watcher.start(timeout=5)
    seen: asyncio.Queue[bytes] = asyncio.Queue()
    await watcher.subscribe("dropped/link", lambda message: seen.put_nowait(message.payload))
    session = Session(fast_settings(proxy.port, keepalive_s=60), client_id="dropped-link")
    lost = asyncio.Event()
    session.on_disconnect(lost.set)
    await session.start(timeout=5)
    try:
        proxy.blackhole()
        held = asyncio.ensure_future(session.publish("dropped/link", b"stale"))
        await asyncio.sleep(0)  # sent into the black hole
        session.drop_link("the lease ended unanswered")
        await asyncio.wait_for(lost.wait(), 5)
        with pytest.raises(SessionError):
            await asyncio.wait_for(held, 5)
        await proxy.wait_for(lambda: proxy.stats.resets > 0)
        proxy.set_pass()
        await session.wait_connected(timeout=10)
        await session.publish("dropped/link", b"after", timeout=5)
        assert await asyncio.wait_for(seen.get(), 5) == b"after"
    finally:
        await session.stop()
        await watcher.stop()


async def test_a_request_whose_connection_ends_before_its_response_fails_then(
    store: EmbeddedStateStore, proxy: FaultProxy
) -> None:
    """The sessions are clean: a response the broker had not delivered is gone with the
    connection, and the caller learns so at once (it may try again on the next one), not at
    the request's timeout."""
    session = Session(fast_settings(proxy.port), client_id="lost-response")
    await session.start(timeout=5)
    client = StateStoreClient(session, request_timeout_s=30)
    await client.start()
    try:
        held = asyncio.Event()
        hold_requests(store, lambda payload: held.set())
        request = asyncio.ensure_future(client.get(b"k"))
        await asyncio.wait_for(held.wait(), 5)
        # Acknowledged: a publish's PUBACK comes after the request's on one connection.
        await session.publish("lost-response/after", b"", qos=1)
        assert not request.done()
        proxy.cut()
        with pytest.raises(ResponseLost, match="GET got no response: the connection"):
            await asyncio.wait_for(request, 5)  # of its 30 s
        assert isinstance(request.exception(), RequestTimeout)  # a timeout to every caller
        assert client.requests.counts[("GET", "timeout")] == 1
    finally:
        await client.close()
        await session.stop()
