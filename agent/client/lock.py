"""A leased lock in the state store (protocol.md §6), with fencing tokens.

The store only knows a key with an expiry; what makes it a lock is kept here: who holds
it, the fencing token of the latest acquire or renewal, and a local lease deadline on the
monotonic clock, so that a holder that cannot reach the store, or was paused, gives up
before the store lets anyone else in.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from enum import Enum

from agent.client.errors import FencedByAnotherLock, FencingTokenLowerVersion
from agent.client.shown import show_key
from agent.client.statestore import ChangeHandler, Condition, SetResult, StateStoreClient
from agent.protocol.hlc import Hlc

log = logging.getLogger(__name__)


class LossReason(Enum):
    RENEWAL_REFUSED = "renewal refused: another holder has the lock"
    DEADLINE_PASSED = "local lease deadline passed"
    FENCED_WRITE_REJECTED = "a fenced write was rejected: a newer holder wrote"
    LEASE_FORGOTTEN = "the store no longer has the lease (it restarted without its contents?)"


RENEWALS_PER_TTL = 3
"""The holder renews this many times per lease, so that one lost or late renewal costs
nothing."""


_FENCED_WRITE_ATTEMPTS = 4
"""A fenced write sent again after refusals its own renewals explain, at most."""


def renewal_period_s(ttl_ms: int) -> float:
    return ttl_ms / 1000 / RENEWALS_PER_TTL


def default_safety_margin_s(ttl_s: float) -> float:
    """Room for message delay and clock-rate error before the store's own expiry."""
    return min(max(0.05, ttl_s * 0.1), 1.0)


def process_nonce() -> str:
    """A name for this process, unique in practice: eight hex digits."""
    return os.urandom(4).hex()


def process_holder(instance_id: str, nonce: str | None = None) -> str:
    """The lock value for this process: the instance id and a nonce of this process.

    Gateways cloned from one image can share an instance id; with the id alone as holder,
    NEX would take one's acquisition for the other's renewal and both would drive the line.
    """
    return f"{instance_id}{HOLDER_SEPARATOR}{nonce or process_nonce()}"


HOLDER_SEPARATOR = "#"


def holder_instance(holder: bytes | str) -> str:
    """The instance id in a holder value (everything before the process nonce)."""
    text = holder.decode(errors="replace") if isinstance(holder, bytes) else holder
    return text.split(HOLDER_SEPARATOR, 1)[0]


class LeasedLock:
    """One holder's view of a lease.

    Each acquisition starts a lease, numbered by `epoch`; renewals extend it, and may
    overlap (each is bounded by the caller's timeout), so that a slow link does not cost
    the lease while the store keeps extending it. An answer that comes back after the
    lease was lost belongs to the lost lease and is not taken as holding it again.
    """

    def __init__(
        self,
        client: StateStoreClient,
        lock_key: bytes | str,
        holder: bytes | str,
        *,
        safety_margin_s: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.key = lock_key.encode() if isinstance(lock_key, str) else lock_key
        self.holder = holder.encode() if isinstance(holder, str) else holder
        self._margin = safety_margin_s
        self._monotonic = monotonic
        self._token: Hlc | None = None
        self._deadline: float | None = None
        self._ttl_ms: int | None = None
        self._epoch = 0
        # The send time of the newest acquire or renewal not answered yet: its effect at
        # the store is unknown, and may be a version newer than our token.
        self._unanswered_since: float | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._loss_handlers: list[Callable[[LossReason], None]] = []
        self._doubted_at: float | None = None
        self.last_granted: Hlc | None = None
        """The newest token the store granted us within a lease we held (kept after the
        lease ends): the lock still at that version with our value proves that no one
        else held it since."""
        self.last_sent_at: float | None = None
        """The send time (monotonic) of the newest acquire or renewal."""
        self.on_round_trip: Callable[[float], None] | None = None
        """Told how long each answered acquire, renewal or read of the lock took."""

    # ------------------------------------------------------------------ state

    @property
    def token(self) -> Hlc | None:
        """The fencing token while the lease is held locally and not in doubt, else None."""
        return self._token if self.held and self._doubted_at is None else None

    @property
    def confirmed(self) -> bool:
        """False from `doubt()` until a renewal sent after it succeeds."""
        return self._doubted_at is None

    def doubt(self) -> None:
        """The link to the store was down: a store that restarted meanwhile may have
        forgotten the lease and handed it to someone else. Until a renewal sent from now on
        succeeds, `token` is None, so that no fenced write goes out with a token the store
        may no longer stand behind; and a renewal first reads the lock: gone, or another's,
        the lease is lost."""
        if self._token is not None:
            self._doubted_at = self._monotonic()

    @property
    def held(self) -> bool:
        return (
            self._token is not None
            and self._deadline is not None
            and self._monotonic() < self._deadline
        )

    @property
    def deadline(self) -> float | None:
        """The local lease deadline on the monotonic clock."""
        return self._deadline if self._token is not None else None

    @property
    def epoch(self) -> int:
        """Changes whenever a lease ends: a token of one epoch is never one of the next."""
        return self._epoch

    def margin_s(self, ttl_ms: int) -> float:
        ttl_s = ttl_ms / 1000
        return self._margin if self._margin is not None else default_safety_margin_s(ttl_s)

    def on_lost(self, handler: Callable[[LossReason], None]) -> None:
        self._loss_handlers.append(handler)

    # ------------------------------------------------------------------ operations

    async def try_acquire(self, ttl_ms: int, *, timeout: float | None = None) -> Hlc | None:
        """SET NEX PX: the fencing token when held, None when someone else holds it."""
        if ttl_ms <= 0:
            raise ValueError("ttl_ms must be positive")
        epoch, sent_at = self._epoch, self._monotonic()
        self._unanswered_since = sent_at
        self.last_sent_at = sent_at
        result = await self.client.set(
            self.key, self.holder, condition=Condition.NEX, expiry_ms=ttl_ms, timeout=timeout
        )
        self._round_trip(sent_at)
        if self._unanswered_since == sent_at:
            self._unanswered_since = None
        if epoch != self._epoch:
            # The lease this was sent for ended meanwhile; the store may still hold it for
            # us until its expiry, but only a new acquisition counts as holding it again.
            log.info("lock %s: a late answer for a lost lease ignored", show_key(self.key))
            return None
        return self._settle(result, sent_at, ttl_ms)

    async def renew(self, *, timeout: float | None = None) -> Hlc | None:
        """Extends the lease; a refusal is a loss. None when not held."""
        if self._ttl_ms is None or self._token is None:
            return None
        epoch = self._epoch
        if self._doubted_at is not None:
            # SET NEX cannot tell extending our lock from creating it anew: after a store
            # that forgot it (and maybe gave it to another, whose lease it forgot too), a
            # "renewal" would be a new lease driving without the lock delay. Only a lock
            # still ours is renewed.
            holder, _ = await self.client.get(self.key, timeout=timeout)
            if epoch != self._epoch:
                return None
            if holder != self.holder:
                self._lose(LossReason.LEASE_FORGOTTEN)
                return None
        token = await self.try_acquire(self._ttl_ms, timeout=timeout)
        if token is None and epoch == self._epoch:
            self._lose(LossReason.RENEWAL_REFUSED)
        return token

    async def release(self, *, timeout: float | None = None) -> bool:
        """VDEL: deletes the lock only if it is still ours."""
        self._clear()
        return await self.client.vdelete(self.key, self.holder, timeout=timeout) == 1

    async def still_our_last_lease(self, *, timeout: float | None = None) -> bool:
        """True when the store holds the lock with our value at the version of our last
        granted lease: nobody else held it since (the store has kept it all along)."""
        if self.last_granted is None:
            return False
        sent_at = self._monotonic()
        value, version = await self.client.get(self.key, timeout=timeout)
        self._round_trip(sent_at)
        return value == self.holder and version == self.last_granted

    async def current_holder(self, *, timeout: float | None = None) -> bytes | None:
        sent_at = self._monotonic()
        value, _ = await self.client.get(self.key, timeout=timeout)
        self._round_trip(sent_at)
        return value

    def _round_trip(self, sent_at: float) -> None:
        if self.on_round_trip is not None:
            self.on_round_trip(self._monotonic() - sent_at)

    async def observe(self, handler: ChangeHandler) -> bytes | None:
        """Watches the lock key (a DELETE means released or expired); returns the holder."""
        value, _ = await self.client.observe(self.key, handler)
        return value

    async def fenced_set(
        self,
        key: bytes | str,
        value: bytes | str,
        *,
        condition: Condition | None = None,
        timeout: float | None = None,
    ) -> SetResult:
        """Writes with the current token. A rejection is a loss, unless a renewal of ours
        whose answer has not come back explains it: others may fence their writes with the
        lock's latest version, and that can be such a renewal."""
        token = self.token
        if token is None:
            raise LockNotHeld(f"{self.key!r} is not held")
        for attempt in range(_FENCED_WRITE_ATTEMPTS):
            try:
                return await self.client.set(
                    key, value, condition=condition, fencing_token=token, timeout=timeout
                )
            except FencingTokenLowerVersion:
                holder, version = await self.client.get(self.key, timeout=timeout)
                # Explained when the newer token is a renewal of this lease: one whose
                # answer has not come back yet, or one that came back while this write was
                # on its way (our token is that version already). On a slow link renewals
                # follow each other faster than their answers: the write can be refused
                # again, by the next one. Another's lock is a loss.
                current = self._token
                explained = (
                    holder == self.holder
                    and version is not None
                    and version > token
                    and self.held
                    and current is not None
                    and (self._unanswered_since is not None or current >= version)
                )
                if not explained or attempt == _FENCED_WRITE_ATTEMPTS - 1:
                    if holder == self.holder and version == token and self.held:
                        # The lock's version is still our token (read after the refusal):
                        # no holder of this lock ever wrote with a newer one. Another
                        # lock's holder did.
                        raise FencedByAnotherLock(_bytes(key), self.key) from None
                    self._lose(LossReason.FENCED_WRITE_REJECTED)
                    raise
                assert version is not None and current is not None
                token = self._token = max(version, current)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def report_fenced_write_rejected(self) -> None:
        self._lose(LossReason.FENCED_WRITE_REJECTED)

    # ------------------------------------------------------------------ internals

    def _settle(self, result: SetResult, sent_at: float, ttl_ms: int) -> Hlc | None:
        if not result.applied or result.version is None:
            return None
        if self._token is not None and result.version < self._token:
            # Our value, set at an older version: the answer to an earlier request of ours
            # (overlapping renewals), handled after a later one's. The lease is held, at the
            # newer token; never hand out the older one. (Equal is fine: fenced_set may have
            # adopted this renewal's version already.)
            log.debug(
                "lock %s: an older answer (%s) after a newer one",
                show_key(self.key),
                result.version,
            )
            return self._token
        # From the send time: the store's expiry started no earlier than that.
        deadline = sent_at + ttl_ms / 1000 - self.margin_s(ttl_ms)
        if deadline <= self._monotonic():
            log.warning("lock %s: acquired but already past the local deadline", show_key(self.key))
            return None
        if self._deadline is not None and self._token is not None:
            deadline = max(deadline, self._deadline)  # overlapping renewals: keep the later
        self._token, self._deadline, self._ttl_ms = result.version, deadline, ttl_ms
        self.last_granted = result.version
        if self._doubted_at is not None and sent_at >= self._doubted_at:
            self._doubted_at = None
        self._arm_deadline_timer()
        return result.version

    def _arm_deadline_timer(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        assert self._deadline is not None
        delay = max(0.0, self._deadline - self._monotonic())
        self._deadline_timer = asyncio.get_running_loop().call_later(delay, self._check_deadline)

    def _check_deadline(self) -> None:
        self._deadline_timer = None
        if self._token is None or self._deadline is None:
            return
        if self._monotonic() >= self._deadline:
            self._lose(LossReason.DEADLINE_PASSED)
        else:  # the timer ran early, or on a clock that differs from ours
            self._arm_deadline_timer()

    def _clear(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if self._token is not None:
            self._epoch += 1
        self._token = None
        self._deadline = None
        self._doubted_at = None

    def _lose(self, reason: LossReason) -> None:
        if self._token is None:
            return
        self._clear()
        log.warning("lock %s lost: %s", show_key(self.key), reason.value)
        for handler in self._loss_handlers:
            handler(reason)


class LockNotHeld(RuntimeError):
    pass


def _bytes(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else key
