"""A key fenced by a new active: read, and written back unchanged with its token.

The store fences a key by the token of its last write, not by the lock: without this, a write
the former active sent before its deadline and the network delivered late (a partition
healing) would still be accepted."""

from __future__ import annotations

from collections.abc import Awaitable

from agent.client.errors import NotAuthorized
from agent.client.lock import LeasedLock
from agent.client.statestore import Condition, StateStoreClient
from agent.protocol.hlc import Hlc
from agent.sync.store_errors import StoreErrors

Fenced = tuple[bytes | None, Hlc | None] | BaseException
"""A key fenced at a takeover: its value and version, or the error that kept it unfenced."""

ATTEMPTS = 3
"""Reads and writes back, while others keep writing the key meanwhile."""


async def fence(
    client: StateStoreClient, lock: LeasedLock, errors: StoreErrors, key: str, writing: str
) -> tuple[bytes | None, Hlc | None]:
    """The key's value and version, written back with the lock's token only if it is still
    that value (NEX). `writing` names the write for a refusal (store_errors)."""
    value, version = await client.get(key)
    for _ in range(ATTEMPTS):
        if value is None:
            break
        try:
            fenced = await lock.fenced_set(key, value, condition=Condition.NEX)
        except NotAuthorized as exc:
            errors.failed(exc, key, writing)
            break
        if fenced.applied:
            errors.allowed(key)
            break
        value, version = await client.get(key)  # written meanwhile: once more
    return value, version


async def outcome(
    fenced: Fenced | Awaitable[tuple[bytes | None, Hlc | None]],
) -> tuple[bytes | None, Hlc | None]:
    """The value and version of a key fenced already, or being fenced; raises the error that
    kept it unfenced."""
    if isinstance(fenced, BaseException):
        raise fenced
    return fenced if isinstance(fenced, tuple) else await fenced
