"""A takeover whose lease falls in doubt (a reconnect while it waits out the previous lease)
against a real store: the lease is confirmed before the takeover's fences and writes, and the
instance says it became active. Before, it went on as active without saying so (no "became
active", health and the soak saw no active) and its fences were refused."""

from __future__ import annotations

import asyncio
import time

from agent.pair.lock_delay import LockDelay
from tests.pair.support import leadership_on
from tests.support.store_backends import StoreBackend


async def test_a_takeover_in_doubt_is_confirmed_before_it_drives(
    store_backend: StoreBackend,
) -> None:
    confirmed_at_takeover: list[bool] = []

    async def take_over() -> None:
        confirmed_at_takeover.append(leadership.lock.confirmed)

    async with leadership_on(store_backend, "a", ttl_ms=3000, take_over=take_over) as leadership:
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
