"""A live DELETE of the previous lease handled after this instance was granted the lock
ends its wait at once. The store sends the DELETE of a lease that ran out right before it
grants the lock to the request that found it out, and the instance may handle that
notification only after the grant (notifications are queued, answers are not): the
point-to-point soak's standby then waited out most of a TTL more (1.56 s with no active at
TTL 1 s)."""

from __future__ import annotations

import asyncio
import itertools
import time

from agent.client.session import Session
from agent.client.statestore import KeyChange, StateStoreClient
from agent.pair.leadership import Leadership
from agent.pair.lock_delay import LockDelay
from tests.support.store_backends import StoreBackend

_ids = itertools.count()
TTL_MS = 3000


async def test_a_delete_handled_after_the_grant_ends_the_wait(
    store_backend: StoreBackend,
) -> None:
    session = Session(store_backend.settings(), client_id=f"released-{next(_ids)}")
    await session.start(timeout=10)
    client = StateStoreClient(session, request_timeout_s=3)
    await client.start()
    lock_key = f"released-{time.monotonic_ns()}\\lock"

    async def take_over() -> None:
        pass

    async def step_down(reason: str) -> None:
        pass

    leadership = Leadership(
        session,
        client,
        lock_key=lock_key,
        instance_id="b",
        ttl_ms=TTL_MS,
        safety_margin_s=None,
        take_over=take_over,
        step_down=step_down,
        spawn=asyncio.ensure_future,
    )
    try:
        leadership.standing_by()
        # The former holder's lease was seen a moment ago (a refused attempt), and has
        # just run out at the store: the grant comes, its DELETE is handled after it.
        leadership.lock_delay = LockDelay(TTL_MS / 1000)
        leadership.lock_delay.seen_held(time.monotonic())
        waiting = asyncio.Event()
        leadership.on_waiting(waiting.set)
        contending = asyncio.ensure_future(leadership.contend())
        await asyncio.wait_for(waiting.wait(), 5)
        started = time.monotonic()
        leadership._on_lock_change(KeyChange(lock_key.encode(), "DELETE", None, None))
        await asyncio.wait_for(leadership.active_event.wait(), 5)
        await contending
        assert time.monotonic() - started < 0.5 * TTL_MS / 1000
        assert leadership.may_drive()
    finally:
        await leadership.stop()
        await client.close()
        await session.stop()
