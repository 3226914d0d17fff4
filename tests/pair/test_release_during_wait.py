"""A live DELETE of the previous lease handled after this instance was granted the lock
ends its wait at once. The store sends the DELETE of a lease that ran out right before it
grants the lock to the request that found it out, and the instance may handle that
notification only after the grant (notifications are queued, answers are not): the
point-to-point soak's standby then waited out most of a TTL more (1.56 s with no active at
TTL 1 s)."""

from __future__ import annotations

import asyncio
import time

from agent.client.statestore import KeyChange
from agent.pair.lock_delay import LockDelay
from tests.pair.support import leadership_on
from tests.support.store_backends import StoreBackend

TTL_MS = 3000


async def test_a_delete_handled_after_the_grant_ends_the_wait(
    store_backend: StoreBackend,
) -> None:
    async with leadership_on(store_backend, "b", ttl_ms=TTL_MS) as leadership:
        # The former holder's lease was seen a moment ago (a refused attempt), and has
        # just run out at the store: the grant comes, its DELETE is handled after it.
        leadership.lock_delay = LockDelay(TTL_MS / 1000)
        leadership.lock_delay.seen_held(time.monotonic())
        waiting = asyncio.Event()
        leadership.on_waiting(waiting.set)
        contending = asyncio.ensure_future(leadership.contend())
        await asyncio.wait_for(waiting.wait(), 5)
        started = time.monotonic()
        leadership._on_lock_change(KeyChange(leadership.lock_key.encode(), "DELETE", None, None))
        await asyncio.wait_for(leadership.active_event.wait(), 5)
        await contending
        assert time.monotonic() - started < 0.5 * TTL_MS / 1000
        assert leadership.may_drive()
