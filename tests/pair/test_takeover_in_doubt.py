"""A takeover whose lease falls in doubt (a reconnect while it waits out the previous lease)
against a real store: the lease is confirmed before the takeover's fences and writes, and the
instance says it became active. Before, it went on as active without saying so (no "became
active", health and the soak saw no active) and its fences were refused."""

from __future__ import annotations

import asyncio
import itertools
import time

from agent.client.session import Session
from agent.client.statestore import StateStoreClient
from agent.pair.leadership import Leadership
from agent.pair.lock_delay import LockDelay
from tests.support.store_backends import StoreBackend

_ids = itertools.count()


async def test_a_takeover_in_doubt_is_confirmed_before_it_drives(
    store_backend: StoreBackend,
) -> None:
    session = Session(store_backend.settings(), client_id=f"doubt-{next(_ids)}")
    await session.start(timeout=10)
    client = StateStoreClient(session, request_timeout_s=3)
    await client.start()
    confirmed_at_takeover: list[bool] = []

    async def take_over() -> None:
        confirmed_at_takeover.append(leadership.lock.confirmed)

    async def step_down(reason: str) -> None:
        pass

    leadership = Leadership(
        session,
        client,
        lock_key=f"doubt-{time.monotonic_ns()}\\lock",
        instance_id="a",
        ttl_ms=3000,
        safety_margin_s=None,
        take_over=take_over,
        step_down=step_down,
        spawn=asyncio.ensure_future,
    )
    try:
        leadership.standing_by()
        # A holder seen 2.7 s ago: the takeover waits out the last 0.3 s of its lease.
        leadership.lock_delay = LockDelay(3.0)
        leadership.lock_delay.seen_held(time.monotonic() - 2.7)
        waiting = asyncio.Event()
        leadership.on_waiting(waiting.set)  # said when it starts waiting out the lease
        contending = asyncio.ensure_future(leadership.contend())
        await asyncio.wait_for(waiting.wait(), 5)
        leadership.lost_sight()  # back from a link outage while it waits
        assert not leadership.lock.confirmed
        await asyncio.wait_for(leadership.active_event.wait(), 5)
        await contending
        assert confirmed_at_takeover == [True]
        assert leadership.may_drive()
    finally:
        await leadership.stop()
        await client.close()
        await session.stop()
