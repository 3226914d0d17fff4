"""The start's contention and the lease clock's, at once, send one acquisition between them.
Two would be a grant and a renewal of it, answered in either order: with the grant's answer
handled last, it was taken for "someone else holds the lock", the instance waited out a
lock delay of its own lease (3 s) and the start said "started as standby" for an instance
that then took over (an agent's start under load, in the secrets test)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from agent.pair.lock_delay import LockDelay
from tests.pair.support import leadership_on
from tests.support.store_backends import StoreBackend

TTL_MS = 3000


async def test_two_contentions_at_once_send_one_acquisition(store_backend: StoreBackend) -> None:
    took_over = 0

    async def take_over() -> None:
        nonlocal took_over
        took_over += 1

    async with leadership_on(store_backend, "a", ttl_ms=TTL_MS, take_over=take_over) as leader:
        leader.lock_delay = LockDelay(TTL_MS / 1000)  # no lease seen: no delay to wait out
        client = leader.lock.client
        real_set = client.set
        calls = itertools.count()
        second_answered = asyncio.Event()

        async def set_first_answer_last(*args: Any, **kwargs: Any) -> Any:
            # The first request's answer waits for a second's, if one is sent (at most 1 s).
            first = next(calls) == 0
            result = await real_set(*args, **kwargs)
            if first:
                await asyncio.wait([asyncio.ensure_future(second_answered.wait())], timeout=1)
            else:
                second_answered.set()
            return result

        client.set = set_first_answer_last  # type: ignore[method-assign]
        waited: list[bool] = []
        leader.on_waiting(lambda: waited.append(True))
        await asyncio.wait_for(asyncio.gather(leader.contend(), leader.contend()), 10)
        assert next(calls) == 1  # one SET NEX was sent before this count
        assert leader.may_drive() and leader.active_event.is_set()
        assert took_over == 1 and not waited
