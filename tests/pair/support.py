"""A Leadership on a real store (embedded broker or mosquitto), for the tests of a takeover's
steps: its line is the `take_over` given, stepping down does nothing."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from agent.client.session import Session
from agent.client.statestore import StateStoreClient
from agent.pair.leadership import Leadership
from tests.support.store_backends import StoreBackend

_ids = itertools.count()


@contextlib.asynccontextmanager
async def leadership_on(
    store_backend: StoreBackend,
    name: str,
    *,
    ttl_ms: int,
    take_over: Callable[[], Awaitable[None]] | None = None,
) -> AsyncIterator[Leadership]:
    """Instance `name` of a lock of its own (`<name>-<n>\\lock`), standing by."""
    session = Session(store_backend.settings(), client_id=f"{name}-{next(_ids)}")
    await session.start(timeout=10)
    client = StateStoreClient(session, request_timeout_s=3)
    await client.start()

    async def nothing() -> None:
        pass

    async def step_down(reason: str) -> None:
        pass

    leadership = Leadership(
        session,
        client,
        lock_key=f"{name}-{time.monotonic_ns()}\\lock",
        instance_id=name,
        ttl_ms=ttl_ms,
        safety_margin_s=None,
        take_over=take_over or nothing,
        step_down=step_down,
        spawn=asyncio.ensure_future,
    )
    try:
        leadership.standing_by()
        yield leadership
    finally:
        await leadership.stop()
        await client.close()
        await session.stop()
