"""A key fenced by a new active: read, and written back unchanged with its token.

The store fences a key by the token of its last write, not by the lock: without this, a write
the former active sent before its deadline and the network delivered late (a partition
healing) would still be accepted.

A key older than a value it is known to have held (`restore`: the store went back in time,
losing writes it had acknowledged) is not written back as it is: that would give the stale
value a version newer than the writes the store lost, and whoever reads it next would take
it for a remote change. It gets the newest value it held back instead."""

from __future__ import annotations

from collections.abc import Awaitable

from agent.client.errors import NotAuthorized
from agent.client.lock import LeasedLock
from agent.client.statestore import Condition, StateStoreClient
from agent.protocol.hlc import Hlc
from agent.sync.decisions import went_back
from agent.sync.store_errors import StoreErrors

Fenced = tuple[bytes | None, Hlc | None] | BaseException
"""A key fenced at a takeover: its value and version, or the error that kept it unfenced."""

ATTEMPTS = 3
"""Reads and writes back, while others keep writing the key meanwhile."""


async def fence(
    client: StateStoreClient,
    lock: LeasedLock,
    errors: StoreErrors,
    key: str,
    writing: str,
    restore: tuple[bytes, Hlc] | None = None,
) -> tuple[bytes | None, Hlc | None]:
    """The key's value and version, written back with the lock's token only if it is still
    that value (NEX). `writing` names the write for a refusal (store_errors). `restore`: the
    newest value the key is known to have held, and its version; a key holding an older one
    gets it back (the value and version returned are then the write's)."""
    # A takeover fences every key at once: in bulk, so that its renewals keep room.
    async with client.bulk:
        value, version = await client.get(key)
    for _ in range(ATTEMPTS):
        if value is None:
            break
        stale = restore is not None and went_back(version, restore[1])
        try:
            async with client.bulk:
                if stale:
                    assert restore is not None
                    fenced = await lock.fenced_set(key, restore[0])
                else:
                    fenced = await lock.fenced_set(key, value, condition=Condition.NEX)
        except NotAuthorized as exc:
            errors.failed(exc, key, writing)
            break
        if fenced.applied:
            errors.allowed(key)
            if stale:
                assert restore is not None
                errors.log.warning(
                    "the store went back in time (it lost writes it had acknowledged): %s "
                    "held %s at version %s, older than the %s it had held at version %s, "
                    "which is written back; check the store's durability (its log, its "
                    "restore from a backup)",
                    key,
                    value.decode(errors="replace")[:32],
                    version,
                    restore[0].decode(errors="replace"),
                    restore[1],
                )
                return restore[0], fenced.version
            break
        async with client.bulk:
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
