"""LeasedLock against the embedded store and against the service on mosquitto."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agent.client import errors
from agent.client.lock import (
    LeasedLock,
    LockNotHeld,
    LossReason,
    default_safety_margin_s,
    holder_instance,
    process_holder,
)
from agent.client.session import Session
from agent.client.statestore import Condition, KeyChange, StateStoreClient
from agent.protocol.hlc import Hlc
from tests.support.store_backends import StoreBackend

_ids = itertools.count()
Connect = Callable[[str], "asyncio.Future[StateStoreClient]"]


@pytest.fixture
async def connect(store_backend: StoreBackend) -> AsyncIterator[Connect]:
    opened: list[tuple[Session, StateStoreClient]] = []

    async def open_client(name: str) -> StateStoreClient:
        session = Session(store_backend.settings(), client_id=f"{name}-{next(_ids)}")
        await session.start(timeout=10)
        client = StateStoreClient(session, request_timeout_s=3)
        await client.start()
        opened.append((session, client))
        return client

    yield open_client  # type: ignore[misc]
    for session, client in opened:
        await client.close()
        await session.stop()


def lock_key() -> str:
    return f"device-{next(_ids)}-{time.monotonic_ns()}\\lock"


class Losses:
    def __init__(self) -> None:
        self.reasons: list[LossReason] = []
        self.event = asyncio.Event()

    def __call__(self, reason: LossReason) -> None:
        self.reasons.append(reason)
        self.event.set()


async def test_acquire_renew_release(connect: Connect) -> None:
    a, b = await connect("a"), await connect("b")
    key = lock_key()
    lock_a, lock_b = LeasedLock(a, key, "a"), LeasedLock(b, key, "b")
    token = await lock_a.try_acquire(5000)
    assert token is not None and lock_a.held and lock_a.token == token
    assert await lock_b.try_acquire(5000) is None
    assert not lock_b.held
    assert await lock_b.current_holder() == b"a"
    renewed = await lock_a.renew()
    assert renewed is not None and renewed > token
    assert await lock_a.release()
    assert not lock_a.held and lock_a.token is None
    assert await lock_b.try_acquire(5000) is not None
    assert not await lock_a.release()  # no longer ours: VDEL leaves b's lock alone
    assert await lock_b.current_holder() == b"b"


async def test_observe_sees_release(connect: Connect) -> None:
    a, b = await connect("a"), await connect("b")
    key = lock_key()
    lock_a, lock_b = LeasedLock(a, key, "a"), LeasedLock(b, key, "b")
    await lock_a.try_acquire(5000)
    released = asyncio.Event()

    def on_change(change: KeyChange) -> None:
        if change.kind == "DELETE":
            released.set()

    assert await lock_b.observe(on_change) == b"a"
    await lock_a.release()
    await asyncio.wait_for(released.wait(), 5)
    assert await lock_b.try_acquire(5000) is not None


async def test_local_deadline_passes_before_the_store_expires_the_lock(connect: Connect) -> None:
    """A lease of 3 s with a margin of 1 s: the answer may take up to 2 s (a loaded machine
    took 0.4 s of a lease of 0.6 s), and the store's expiry comes a second after the loss,
    time for the read that finds the lock still there."""
    client = await connect("a")
    key = lock_key()
    lock = LeasedLock(client, key, "a", safety_margin_s=1.0)
    losses = Losses()
    lock.on_lost(losses)
    sent = time.monotonic()
    assert await lock.try_acquire(3000) is not None
    answered = time.monotonic()
    # Counted from the send time, not from the answer.
    assert lock.deadline is not None and sent + 2.0 <= lock.deadline <= answered + 2.0
    await asyncio.wait_for(losses.event.wait(), 5)
    assert losses.reasons == [LossReason.DEADLINE_PASSED]
    assert not lock.held and lock.token is None
    # The store still holds it: the holder gave up first, as it must.
    assert await lock.current_holder() == b"a"


async def test_a_lost_lock_is_logged_with_its_key_as_text(
    connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    client = await connect("a")
    key = "floor3\\lock-" + lock_key()
    lock = LeasedLock(client, key, "a", safety_margin_s=0.2)
    losses = Losses()
    lock.on_lost(losses)
    assert await lock.try_acquire(600) is not None
    with caplog.at_level(logging.WARNING, logger="agent.client.lock"):
        await asyncio.wait_for(losses.event.wait(), 5)
    (said,) = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert said == f"lock {key} lost: {LossReason.DEADLINE_PASSED.value}"  # not b'floor3\\\\lock'


async def test_renewal_refused_is_a_loss(connect: Connect) -> None:
    a, b = await connect("a"), await connect("b")
    key = lock_key()
    lock_a = LeasedLock(a, key, "a", safety_margin_s=0.05)
    losses = Losses()
    lock_a.on_lost(losses)
    await lock_a.try_acquire(300)
    # a is paused past its lease; b takes over after the store expired it.
    gone = asyncio.Event()
    await b.observe(key, lambda c: gone.set() if c.kind == "DELETE" else None)
    await asyncio.wait_for(gone.wait(), 5)
    assert await LeasedLock(b, key, "b").try_acquire(5000) is not None
    lock_a._deadline = time.monotonic() + 10  # as if its deadline had not passed yet
    lock_a._token = lock_a._token or Hlc(1, 0, "x")
    assert await lock_a.renew() is None
    assert LossReason.RENEWAL_REFUSED in losses.reasons
    assert not lock_a.held


async def test_fenced_write_rejected_is_a_loss(connect: Connect) -> None:
    a, b = await connect("a"), await connect("b")
    key = lock_key()
    data = key.replace("lock", "setPoint")
    lock_a, lock_b = LeasedLock(a, key, "a"), LeasedLock(b, key, "b")
    losses = Losses()
    lock_a.on_lost(losses)
    with pytest.raises(LockNotHeld):
        await lock_a.fenced_set(data, b"20")
    await lock_a.try_acquire(5000)
    assert (await lock_a.fenced_set(data, b"20")).applied
    stale = lock_a.token
    # b becomes the owner (as after a's lease ran out) and writes with its newer token.
    await b.delete(key)
    assert await lock_b.try_acquire(5000) is not None
    assert (await lock_b.fenced_set(data, b"21")).applied
    lock_a._token = stale
    with pytest.raises(errors.FencingTokenLowerVersion):
        await lock_a.fenced_set(data, b"22")
    assert losses.reasons == [LossReason.FENCED_WRITE_REJECTED]
    value, _ = await b.get(data)
    assert value == b"21"


async def test_two_contenders_over_many_rounds(connect: Connect) -> None:
    clients = [await connect("x"), await connect("y")]
    key = lock_key()
    data = key.replace("lock", "setPoint")
    locks = [LeasedLock(c, key, name) for c, name in zip(clients, "xy", strict=True)]
    tokens: list[Hlc] = []
    winners = []
    for round_number in range(30):
        order = locks if round_number % 2 else locks[::-1]  # both get to go first
        results = await asyncio.gather(*(lock.try_acquire(5000) for lock in order))
        held = [lock for lock in locks if lock.held]
        assert len(held) == 1, f"round {round_number}: {len(held)} holders"
        token = next(t for t in results if t is not None)
        assert not tokens or token > tokens[-1]
        tokens.append(token)
        winner = held[0]
        winners.append(winner.holder)
        assert (await winner.fenced_set(data, b"%d" % round_number)).applied
        if len(tokens) > 1:  # the previous round's token is stale now
            with pytest.raises(errors.FencingTokenLowerVersion):
                await winner.client.set(data, b"stale", fencing_token=tokens[-2])
        assert await winner.release()
    assert len(set(winners)) == 2, "both contenders should win some rounds"


def test_safety_margin_defaults() -> None:
    assert default_safety_margin_s(3.0) == pytest.approx(0.3)
    assert default_safety_margin_s(0.1) == 0.05
    assert default_safety_margin_s(60) == 1.0


async def held_against_a_remote_writer(
    connect: Connect,
) -> tuple[StateStoreClient, StateStoreClient, str, str, LeasedLock, Losses]:
    """A lock ("me", not acquired yet) on the holder's client, its losses recorded, and a
    remote writer's client: (holder, remote, lock key, data key, lock, losses)."""
    holder, remote = await connect("holder"), await connect("remote")
    key = lock_key()
    lock = LeasedLock(holder, key, "me")
    losses = Losses()
    lock.on_lost(losses)
    return holder, remote, key, key.replace("lock", "setPoint"), lock, losses


async def test_rejection_by_our_own_newer_version_is_not_a_loss(connect: Connect) -> None:
    """A remote writer fences with the lock's latest version, which can be a renewal of
    ours whose answer has not reached us yet: adopt it and write again."""
    _holder, remote, key, data, lock, losses = await held_against_a_remote_writer(connect)
    first = await lock.try_acquire(5000)
    assert first is not None and (await lock.fenced_set(data, b"20")).applied
    latest = await lock.renew()
    assert latest is not None
    # As if the renewal's answer were still on its way.
    lock._token, lock._unanswered_since = first, time.monotonic()
    _, version = await remote.get(key)
    assert version == latest
    assert (await remote.set(data, b"21", fencing_token=version)).applied
    assert (await lock.fenced_set(data, b"22")).applied
    assert lock.token == latest
    assert losses.reasons == []
    # The renewal's answer arriving late with the adopted version is no loss either.
    assert await lock.renew() is not None and losses.reasons == []


async def test_a_write_refused_again_by_the_next_renewal_is_not_a_loss(connect: Connect) -> None:
    """On a slow link renewals follow each other faster than their answers: the write sent
    again with the version read after its refusal is refused by the next renewal. The
    30-minute soak saw an active step down for it, with nobody else holding the lock."""
    holder, remote, key, data, lock, losses = await held_against_a_remote_writer(connect)
    assert await lock.try_acquire(5000) is not None

    async def renewal_not_heard_of(remote_value: bytes) -> None:
        # Our renewal, as the store takes it; its answer is still on the slow link.
        renewed = await remote.set(key, b"me", condition=Condition.NEX, expiry_ms=5000)
        assert renewed.applied and renewed.version is not None
        assert (await remote.set(data, remote_value, fencing_token=renewed.version)).applied

    lock._unanswered_since = time.monotonic()
    await renewal_not_heard_of(b"21")
    real_get = holder.get
    reads = 0

    async def another_renewal_after_the_read(target: bytes | str, **kwargs: Any) -> Any:
        nonlocal reads
        answer = await real_get(target, **kwargs)
        reads += 1
        if reads == 1:
            await renewal_not_heard_of(b"22")
        return answer

    holder.get = another_renewal_after_the_read  # type: ignore[method-assign]
    assert (await lock.fenced_set(data, b"23")).applied
    assert reads == 2 and losses.reasons == []
    assert (await remote.get(data))[0] == b"23"


async def test_rejection_by_a_renewal_answered_meanwhile_is_not_a_loss(connect: Connect) -> None:
    """The write went out with the token of before a renewal, a remote writer fenced with
    the renewal's version, and the renewal's answer came back while the write was on its
    way: our token is that version by then, so the rejection is ours to explain (the soak
    saw an active step down for this, with no fault at all)."""
    holder, remote, key, data, lock, losses = await held_against_a_remote_writer(connect)
    first = await lock.try_acquire(5000)
    assert first is not None and (await lock.fenced_set(data, b"20")).applied
    latest = await lock.renew()
    assert latest is not None
    lock._token = first  # the write below goes out with the token of before the renewal
    _, version = await remote.get(key)
    assert (await remote.set(data, b"21", fencing_token=version)).applied
    real_set = holder.set

    async def answered_meanwhile(*args: object, **kwargs: object) -> object:
        try:
            return await real_set(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            lock._token = latest  # the renewal's answer arrives while this one is out

    holder.set = answered_meanwhile  # type: ignore[method-assign]
    assert (await lock.fenced_set(data, b"22")).applied
    assert losses.reasons == [] and lock.token == latest


async def test_an_unexplained_newer_version_of_our_holder_is_a_loss(connect: Connect) -> None:
    """With no renewal of ours unanswered, a newer version under our holder value is not
    ours: another process writes with our holder value (a clone), so we give up."""
    holder, other = await connect("holder"), await connect("other")
    key = lock_key()
    data = key.replace("lock", "setPoint")
    lock = LeasedLock(holder, key, "me#1")
    losses = Losses()
    lock.on_lost(losses)
    assert await lock.try_acquire(5000) is not None
    assert (await lock.fenced_set(data, b"20")).applied
    clone = LeasedLock(other, key, "me#1")  # the same holder value in another process
    newer = await clone.try_acquire(5000)
    assert newer is not None and (await clone.fenced_set(data, b"21")).applied
    with pytest.raises(errors.FencingTokenLowerVersion):
        await lock.fenced_set(data, b"22")
    assert losses.reasons == [LossReason.FENCED_WRITE_REJECTED]


async def test_overlapping_renewals_keep_the_lease_and_a_late_answer_does_not_revive_it(
    connect: Connect,
) -> None:
    client = await connect("a")
    key = lock_key()
    lock = LeasedLock(client, key, "a#1", safety_margin_s=0.05)
    losses = Losses()
    lock.on_lost(losses)
    first = await lock.try_acquire(2000)
    assert first is not None
    epoch = lock.epoch
    tokens = await asyncio.gather(*(lock.renew() for _ in range(3)))
    assert all(t is not None for t in tokens) and lock.held and lock.epoch == epoch
    assert sorted(tokens) == tokens and lock.token == tokens[-1]  # type: ignore[type-var]
    # A renewal answered after the lease was lost belongs to the lost lease.
    renewal = asyncio.ensure_future(lock.renew())
    lock._lose(LossReason.DEADLINE_PASSED)
    assert await renewal is None
    assert not lock.held and lock.epoch == epoch + 1
    assert losses.reasons == [LossReason.DEADLINE_PASSED]


async def test_an_older_answer_handled_after_a_newer_one_keeps_the_lease(
    connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    # Two acquisitions of ours at once (the second a renewal of the first), the first one's
    # answer handled last: the lease is held at the newer token, and neither call says
    # "someone else holds it" (was: None and an ERROR "token did not increase").
    client = await connect("a")
    lock = LeasedLock(client, lock_key(), "a#1")
    second_answered = asyncio.Event()
    real_set = client.set
    calls = itertools.count()

    async def set_first_answer_last(*args: Any, **kwargs: Any) -> Any:
        first = next(calls) == 0
        result = await real_set(*args, **kwargs)
        if first:
            await asyncio.wait_for(second_answered.wait(), 5)
        else:
            second_answered.set()
        return result

    client.set = set_first_answer_last  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING)
    older, newer = await asyncio.gather(lock.try_acquire(5000), lock.try_acquire(5000))
    assert older is not None and newer is not None
    assert older == newer == lock.token and lock.held
    assert await lock.current_holder() == b"a#1"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_holder_values_identify_the_process() -> None:
    first, second = process_holder("gw1"), process_holder("gw1")
    assert first != second
    assert holder_instance(first) == holder_instance(second.encode()) == "gw1"


async def test_after_a_doubt_nothing_is_fenced_until_a_renewal_confirms(connect: Connect) -> None:
    client = await connect("a")
    key = lock_key()
    data = key.replace("lock", "setPoint")
    lock = LeasedLock(client, key, "a#1")
    first = await lock.try_acquire(5000)
    lock.doubt()  # as after a reconnect: the store may have restarted without the lock
    assert lock.held and not lock.confirmed and lock.token is None
    with pytest.raises(LockNotHeld):
        await lock.fenced_set(data, b"20")
    renewed = await lock.renew()
    assert renewed is not None and first is not None and renewed > first
    assert lock.confirmed and lock.token == renewed
    assert (await lock.fenced_set(data, b"20")).applied


@pytest.mark.parametrize("found", [None, b"b#2"], ids=["forgotten", "another-holds-it"])
async def test_after_a_doubt_a_lock_no_longer_ours_is_lost_not_renewed(
    connect: Connect, found: bytes | None
) -> None:
    """A store that restarted without its contents has no lock (or gave it to another):
    SET NEX would create it, and the 'renewal' would be a new lease that skips the lock
    delay (two instances could then drive the line after two such restarts). The lease is
    lost instead, and the lock is left as the store has it."""
    client = await connect("a")
    key = lock_key()
    lock = LeasedLock(client, key, "a#1")
    losses = Losses()
    lock.on_lost(losses)
    assert await lock.try_acquire(5000) is not None
    if found is None:
        await client.delete(key)  # what a store restarting without its contents leaves
    else:
        await client.set(key, found)
    lock.doubt()
    assert await lock.renew() is None
    assert not lock.held and losses.reasons == [LossReason.LEASE_FORGOTTEN]
    assert (await client.get(key))[0] == found  # not created again, not overwritten


async def test_a_lease_lost_here_but_still_the_stores_is_known_as_ours(connect: Connect) -> None:
    """The soak's D7: an active paused past its own deadline, its lease still at the store,
    waited a whole lock delay before driving again (and kept the standby out meanwhile).
    The lock at the version of our last granted lease proves nobody held it since."""
    a, b = await connect("a"), await connect("b")
    key = lock_key()
    lock = LeasedLock(a, key, "a#1", safety_margin_s=1.0)
    losses = Losses()
    lock.on_lost(losses)
    assert not await lock.still_our_last_lease()  # never held: nothing to prove
    assert await lock.try_acquire(1500) is not None
    await asyncio.wait_for(losses.event.wait(), 5)  # the local deadline, 1 s before the store's
    assert await lock.still_our_last_lease()
    # Expired at the store and taken by another: not ours any more, not even after that.
    gone = asyncio.Event()
    await b.observe(key, lambda c: gone.set() if c.kind == "DELETE" else None)
    await asyncio.wait_for(gone.wait(), 5)
    assert not await lock.still_our_last_lease()
    other = LeasedLock(b, key, "b#1")
    assert await other.try_acquire(5000) is not None
    assert not await lock.still_our_last_lease()
    # Ours again by a new acquisition: a new version, the one proven from then on.
    await other.release()
    assert await lock.try_acquire(5000) is not None
    assert await lock.still_our_last_lease()


async def test_a_key_written_under_another_lock_is_refused_without_losing_ours(
    connect: Connect,
) -> None:
    """A device configured on two lines: its key last written with the other line's newer
    token. Our lease, intact at the store, is not lost for it (both lines flapped)."""
    a, b = await connect("a"), await connect("b")
    ours, theirs = LeasedLock(a, lock_key(), "a#1"), LeasedLock(b, lock_key(), "b#1")
    losses = Losses()
    ours.on_lost(losses)
    data = f"shared-{time.monotonic_ns()}\\setPoint"
    assert await ours.try_acquire(5000) is not None
    assert await theirs.try_acquire(5000) is not None  # newer: granted after ours
    assert (await theirs.fenced_set(data, b"21")).applied
    with pytest.raises(errors.FencedByAnotherLock):
        await ours.fenced_set(data, b"22")
    assert losses.reasons == [] and ours.held
    value, _ = await b.get(data)
    assert value == b"21"
