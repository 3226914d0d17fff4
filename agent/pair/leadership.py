"""Who drives the line: contending for its lock, holding it, and stepping down.

An instance is active only within the lease that made it active, and only once the
previous lease has provably ended (agent.pair.lock_delay). Renewals run on the monotonic
clock, as often as the link's round trip asks (agent.pair.renewal), and overlap, each
bounded by a lease. A loss of any kind (a refused renewal, the local deadline, a fenced
write rejected) stops the driving first, then the instance contends again; the standby
contends every third of a TTL as well, and at once when it sees the lock deleted. A link
too slow to hold a lease does not contend: it says so instead of flapping.

Whatever happened before, an instance of a pair reconnects to the broker within a TTL
(within a twelfth of one while it holds a lease): a reconnect storm is spread by jitter
below that, never by half a minute of absence.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agent.client.errors import StateStoreError
from agent.client.lock import LeasedLock, LossReason, holder_instance, process_holder
from agent.client.session import Session, SessionError
from agent.client.statestore import KeyChange, StateStoreClient
from agent.pair.lock_delay import LockDelay
from agent.pair.renewal import MOST_RENEWALS_PER_TTL, RENEWALS_PER_TTL, LeaseTiming, RoundTrips
from agent.protocol.hlc import Hlc
from agent.tally import Tally

log = logging.getLogger("agent")


HEAR_FIRST_S = 0.2
"""The longest a standby waits, after a release, for what the store said before it."""


class Role(enum.Enum):
    STARTING = "starting"
    STANDBY = "standby"
    ACTIVE = "active"
    STOPPING = "stopping"


# Why a role changed, as counted: became active, handed the line over on request, stepped
# down because its own deadline passed (it fenced itself), or because the lease was lost.
TAKEOVER, SWITCHOVER, SELF_FENCE, LOST_LEASE = "takeover", "switchover", "self_fence", "lost_lease"

TakeOver = Callable[[], Awaitable[None]]
StepDown = Callable[[str], Awaitable[None]]


class Leadership:
    def __init__(
        self,
        session: Session,
        client: StateStoreClient,
        *,
        lock_key: str,
        instance_id: str,
        ttl_ms: int,
        safety_margin_s: float | None,
        take_over: TakeOver,
        step_down: StepDown,
        spawn: Callable[[Awaitable[Any]], asyncio.Future[Any]],
        process: str | None = None,
    ) -> None:
        self.session = session
        self.client = client
        self.instance_id = instance_id
        self.lock_key = lock_key
        self.ttl_ms = ttl_ms
        self.holder = process_holder(instance_id, process).encode()
        self.lock = LeasedLock(client, lock_key, self.holder, safety_margin_s=safety_margin_s)
        self.lock.on_lost(self._on_lost)
        self.timing = LeaseTiming(ttl_ms / 1000, self.lock.margin_s(ttl_ms))
        self.round_trips = RoundTrips()
        self.lock.on_round_trip = self.round_trips.add
        self.too_slow: float | None = None
        """The round trip (s) that keeps this instance from holding a lease, while it does."""
        self._lease_wake = asyncio.Event()
        self.lock_delay = LockDelay.starting(ttl_ms / 1000, time.monotonic())
        self._released = asyncio.Event()
        """Set by every live DELETE of the lock: a takeover's wait looks again."""
        self.role = Role.STARTING
        self.losses = 0
        self.role_changes = Tally()
        self.seen_holder: bytes | None = None
        """The lock's holder as last read or notified (None: nobody holds it)."""
        """Role changes by why: takeover, switchover, self_fence, lost_lease."""
        self._take_over_line = take_over
        self._step_down_line = step_down
        self._spawn = spawn
        self._active_epoch: int | None = None
        self._role_change = asyncio.Lock()
        # One contention at a time: the start's and the lease clock's would each send a SET
        # NEX, the second a renewal of the first, and their answers may be handled in either
        # order (an older grant after a newer one is no grant: a lock delay waited for
        # nothing, and the start said "standby" for an instance that took over).
        self._contending = asyncio.Lock()
        self._renewals: set[asyncio.Future[Any]] = set()
        self._contender: asyncio.Future[Any] | None = None
        self._duplicates_reported: set[bytes] = set()
        self._former_holders: set[bytes] = set()
        self.active_event = asyncio.Event()  # set while active, for tests and --simulate
        # Asked before every contention: True while this instance leaves the lock to
        # another (a switchover in progress, see agent.runtime.control).
        self.hold_off: Callable[[], bool] = lambda: False
        # Run before contending again after a lease the store no longer had: looks for a
        # proof that the store kept its contents (see store_kept_its_contents).
        self.look_before_contending: Callable[[], Awaitable[None]] | None = None
        # Awaited by a takeover before anything else (the devices' keys watched at start).
        self.ready_to_take_over: Callable[[], Awaitable[Any]] = _nothing_to_wait_for
        # Shown every change of the lock first (the line's history names former holders).
        self.on_lock_seen: Callable[[KeyChange], None] = lambda change: None
        self.taking_over_until: float | None = None
        """While holding the lock and waiting for the previous lease to end: until when
        (monotonic)."""
        self._on_waiting: Callable[[], None] = lambda: None
        self.last_holder_was_another = False
        """The last lease this instance saw was another instance's (not its own, nor its
        former process's): it asks for the lock only as that lease could end, so that the
        holder of a lease the store forgot (a restart without its contents) gets it back
        first. That holder knows what it last synced; the records that said so went with
        the store, and a standby that had not read them yet (just started, or cut off)
        would take those syncs for panel changes and publish them over later changes."""
        self._deferring = False

    def on_waiting(self, said: Callable[[], None]) -> None:
        """`said()` when a takeover starts waiting out the previous lease (for health)."""
        self._on_waiting = said

    def taking_over_s(self) -> float | None:
        """How long this instance still waits, holding the lock, before it drives."""
        until = self.taking_over_until
        return None if until is None else max(0.0, until - time.monotonic())

    # ------------------------------------------------------------------ state

    def may_drive(self) -> bool:
        """Active, within the lease that made it active, confirmed by the store: writes to
        the controllers and the store are allowed only then."""
        return (
            self.role is Role.ACTIVE
            and self.lock.held
            and self.lock.confirmed
            and self.lock.epoch == self._active_epoch
        )

    @property
    def token(self) -> Hlc | None:
        return self.lock.token if self.role is Role.ACTIVE else None

    # ------------------------------------------------------------------ start, stop

    async def watch(self) -> bytes | None:
        """Watches the lock; returns its holder now."""
        asked_at = time.monotonic()
        holder = await self.lock.observe(self._on_lock_change)
        self.saw_holder(holder, asked_at=asked_at)
        return holder

    def standing_by(self) -> None:
        self.role = Role.STANDBY
        self.session.set_reconnect_ceiling(self.idle_reconnect_s)

    @property
    def idle_reconnect_s(self) -> float:
        """The reconnect ceiling without a lease: back on the store within a TTL."""
        return self.timing.ttl_s

    def must_cover(self, hold_s: float) -> None:
        """The longest transaction on the line: renewals keep that much lease ahead."""
        self.timing = LeaseTiming(self.timing.ttl_s, self.timing.margin_s, hold_s)

    async def stop(self) -> bool:
        """Stops driving; returns whether this instance was active (it should release)."""
        was_active = self.role is Role.ACTIVE
        self.role = Role.STOPPING
        self.active_event.clear()
        for renewal in self._renewals:
            renewal.cancel()
        await asyncio.gather(*self._renewals, return_exceptions=True)
        return was_active

    async def release(self) -> None:
        if self.lock.token is None:
            return
        try:
            await self.lock.release(timeout=2)
            log.info("released the lock")
        except (StateStoreError, SessionError) as exc:
            log.warning("could not release the lock (it expires by itself): %s", exc)

    # ------------------------------------------------------------------ contending

    async def contend(self) -> None:
        """Tries to take the lock, and takes over when granted; a contention already in
        progress is waited for, not joined by a second request."""
        async with self._contending:
            await self._contend()

    async def _contend(self) -> None:
        if self.role is not Role.STANDBY or self.lock.held or self.hold_off():
            return
        if not self._link_can_hold():
            return
        try:
            if self.lock_delay.wait_s(time.monotonic()) > 0 and (
                await self.lock.still_our_last_lease(timeout=self.timing.ttl_s)
            ):
                # Our own lease, lost here (a pause, a deadline passed) but still the
                # store's: no one else has held the lock since, so no one else drives.
                log.info("the lock is still our last lease: taking it again at once")
                self.lock_delay.seen_released(time.monotonic())
            if self._defer_to_the_last_holder():
                return
            asked_at = time.monotonic()
            token = await self.lock.try_acquire(self.ttl_ms)
        except (StateStoreError, SessionError) as exc:
            log.debug("lock attempt failed: %s", exc)
            return
        if token is None:  # someone else holds it
            self.lock_delay.seen_held(time.monotonic(), asked_at=asked_at)
            return
        await self._take_over(self.lock.epoch, token)

    def _defer_to_the_last_holder(self) -> bool:
        """True while the lock looks free to this instance, which did not hold its last
        lease, and it leaves the lock to that lease's holder: until half a TTL and two
        round trips before the lease could have ended (it drives no sooner anyway, and the
        standby contends every third of a TTL)."""
        early = self.lock_delay.wait_s(time.monotonic()) - (
            self.timing.ttl_s / 2 + 2 * self.round_trips.worst_s
        )
        looks_free = self.seen_holder is None
        if not (self.last_holder_was_another and looks_free and early > 0):
            self._deferring = False
            return False
        if not self._deferring:
            self._deferring = True
            log.info(
                "the lock %s may be free: left %.1f s to the holder of the last lease, which "
                "may not have ended (this instance did not hold it)",
                self.lock_key,
                early,
            )
        return True

    async def _take_over(self, epoch: int, token: Hlc) -> None:
        """Drives the line under the lease of `epoch`, once the previous lease has ended."""
        log.debug("acquired the lock (token %s): taking over", token)
        self.last_holder_was_another = False
        self._lease_wake.set()  # renewals from now on, at the lease's own period
        # Reconnect fast while the lease is held: a slow reconnect would cost the lease.
        self.session.set_reconnect_ceiling(max(0.05, self.ttl_ms / 12_000))
        async with self._role_change:
            await self.ready_to_take_over()
            wait = self.lock_delay.wait_s(time.monotonic())
            if wait > 0:
                log.info("holding the lock; waiting %.1f s for the previous lease to end", wait)
                until = self.taking_over_until = time.monotonic() + wait
                self._on_waiting()
                try:
                    await self._lock_delay_over(until)
                finally:
                    self.taking_over_until = None
            # A reconnect while the previous lease ran out left ours in doubt: confirmed by
            # the store first, or every fence and write of the takeover would be refused,
            # and this instance never said it became active though it went on to drive.
            await self._until_confirmed(epoch, Role.STANDBY)
            if self.role is not Role.STANDBY or not self.lock.held or self.lock.epoch != epoch:
                return  # lost meanwhile: the loss handler stepped down already
            self.role = Role.ACTIVE
            self._active_epoch = epoch
            # Takeover state first: reconciled before anything else runs as active.
            await self._take_over_line()
            await self._until_confirmed(epoch, Role.ACTIVE)  # a reconnect during it
            if not self.may_drive():
                log.warning(
                    "not active after the takeover: %s",
                    "the lease was lost meanwhile" if self.lock.epoch != epoch else "stepped down",
                )
                return  # the step-down closes up
            self.role_changes.count((TAKEOVER,))
            log.info("became active (fencing token %s)", token)
            self.active_event.set()

    async def _lock_delay_over(self, until: float) -> None:
        """Until `until` (monotonic), or sooner once the previous lease has provably ended.
        The store sends the DELETE of a lease that ran out right before it grants the lock
        to the request that found it out, and this instance may handle that notification
        only after the grant: it ends the wait then, not a TTL later."""
        while (left := until - time.monotonic()) > 0:
            if self.lock_delay.wait_s(time.monotonic()) <= 0:
                return
            self._released.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), left)

    async def _until_confirmed(self, epoch: int, role: Role) -> None:
        """While still `role` and the lease of `epoch` is held but in doubt (a reconnect):
        renews until the store confirms it, or a renewal finds it lost (the loss handler
        then steps down)."""

        def in_doubt() -> bool:
            return (
                self.role is role
                and self.lock.held
                and self.lock.epoch == epoch
                and not self.lock.confirmed
            )

        while in_doubt():
            await self.renew()
            if in_doubt():
                await asyncio.sleep(min(0.05, self.ttl_ms / 20_000))

    def _link_can_hold(self) -> bool:
        """False (and said once, and in health) while the link's round trip is too long
        for a lease: taking the lock would only lose it again."""
        round_trip = self.round_trips.worst_s
        if self.timing.can_hold(round_trip):
            if self.too_slow is not None:
                log.info(
                    "the round trip to the store is %.0f ms again: contending for the lock",
                    round_trip * 1000,
                )
                self.too_slow = None
            return True
        if self.too_slow is None:
            log.error(
                "the round trip to the store takes %.0f ms, too long to hold a lease of "
                "%.0f ms (AGENT_LOCK__TTL_MS): this instance does not contend for the lock "
                "until the link is faster (or the TTL longer)",
                round_trip * 1000,
                self.timing.ttl_s * 1000,
            )
        self.too_slow = round_trip
        return False

    def _on_lost(self, reason: LossReason) -> None:
        if reason is LossReason.DEADLINE_PASSED:
            # Renewals went unanswered for a lease: what this instance sent and the link
            # holds (a partition) must never reach the store after another holder took
            # the lock. A reset link drops it; the session reconnects.
            self.session.drop_link(f"lease of {self.lock_key} ended unanswered")
        look = reason is LossReason.LEASE_FORGOTTEN
        why = SELF_FENCE if reason is LossReason.DEADLINE_PASSED else LOST_LEASE
        self._spawn(self.step_down(reason.value, look_first=look, why=why))

    async def step_down(
        self, reason: str, *, look_first: bool = False, why: str = LOST_LEASE
    ) -> None:
        if not self.lock.held:
            self.session.set_reconnect_ceiling(self.idle_reconnect_s)
        if self.role is not Role.ACTIVE:
            return
        # Writes stop first: may_drive() is false from here on.
        self.role = Role.STANDBY
        self._active_epoch = None
        self.active_event.clear()
        self.losses += 1
        self.role_changes.count((why,))
        log.warning("stepped down to standby: %s", reason)
        if look_first:
            # The lock was gone after a reconnect: expired during a broker outage, or
            # forgotten by the store. Asked for again while the line closes, not after: a
            # takeover waits for the close, and for the lock delay after it, all the same,
            # and a standby that never read this instance's records leaves the lock to it
            # only so long (see last_holder_was_another).
            self._spawn(self._look_then_contend())
        async with self._role_change:
            await self._step_down_line(reason)
        if not look_first:
            await self.contend()

    async def _look_then_contend(self) -> None:
        if self.look_before_contending is not None:
            # A record kept in the store tells a lease that expired from a store that forgot.
            await self.look_before_contending()
        await self.contend()

    async def hand_over(self, reason: str, drain: Callable[[], Awaitable[None]]) -> bool:
        """A planned handover: stops driving, lets `drain` wait for the work in progress
        (a write on the line finishes), releases the lock at once (a standby takes it on
        the DELETE), then closes the line. False if this instance was not active."""
        if self.role is not Role.ACTIVE:
            return False
        self.role = Role.STANDBY  # writes stop first: may_drive() is false from here on
        self._active_epoch = None
        self.active_event.clear()
        self.role_changes.count((SWITCHOVER,))
        log.info("handing over: %s", reason)
        await drain()
        for renewal in self._renewals:
            renewal.cancel()
        await asyncio.gather(*self._renewals, return_exceptions=True)
        await self.release()
        self.session.set_reconnect_ceiling(self.idle_reconnect_s)
        async with self._role_change:  # after a takeover still in progress, if any
            await self._step_down_line(reason)
        return True

    # ------------------------------------------------------------------ the lease

    async def run_lease(self) -> None:
        """The lease's own clock, on the monotonic clock: while held, a renewal each period
        the round trip allows (not awaited: renewals may overlap, so that a slow link does
        not skip renewals the store would have granted); otherwise a contention every
        third of a TTL, or a look at the lock to measure the link while it is too slow."""
        while True:
            self._lease_wake.clear()
            if self.lock.held:
                sent = self.lock.last_sent_at
                due = (sent or 0.0) + self.timing.period_s(self.round_trips.worst_s)
                wait = due - time.monotonic()
                if wait <= 0:
                    renewal = asyncio.ensure_future(self.renew())
                    self._renewals.add(renewal)
                    renewal.add_done_callback(self._renewals.discard)
                    await asyncio.sleep(0)  # its send time is recorded before the next look
                    continue
            else:
                # A link found too slow is measured at the highest rate a lease may cost
                # the store: after an outage (its one long round trip among the samples),
                # the samples of a fast link again push it out within a TTL, not three.
                per_ttl = RENEWALS_PER_TTL if self.too_slow is None else MOST_RENEWALS_PER_TTL
                wait = self.timing.ttl_s / per_ttl
                if self.role is Role.ACTIVE:
                    # An active without a lease is a bug: whatever led here, stop driving.
                    self._spawn(self.step_down("active without a lease"))
                elif self.role is Role.STANDBY and (
                    self._contender is None or self._contender.done()
                ):
                    # Not awaited: a takeover (the line opened, every device reconciled)
                    # must not hold up the renewals of the lease it has just taken.
                    self._contender = self._spawn(self._contend_or_measure())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._lease_wake.wait()

    async def _contend_or_measure(self) -> None:
        if self.timing.can_hold(self.round_trips.worst_s):
            await self.contend()
            return
        # Too slow to hold a lease: keep measuring the link until it is not, then contend
        # at once (the lock may have been free all the while).
        try:
            await self.lock.current_holder(timeout=self.timing.ttl_s)
        except (StateStoreError, SessionError) as exc:
            log.debug("could not look at the lock: %s", exc)
        if self._link_can_hold():
            await self.contend()

    async def renew(self) -> None:
        # Bounded by a whole lease, not by what is left of it: an answer that comes after
        # the deadline belongs to a lost lease and is ignored, and one slower than the
        # rest of the lease may still be the one that extends it.
        try:
            await self.lock.renew(timeout=self.timing.lease_s)
        except (StateStoreError, SessionError) as exc:
            log.warning("lock renewal failed: %s", exc)

    # ------------------------------------------------------------------ seeing the lock

    def _on_lock_change(self, change: KeyChange) -> None:
        self.on_lock_seen(change)
        self.seen_holder = change.value if change.kind == "SET" else None
        if change.kind == "SET":
            self._saw_holder(change.value, live=not change.synthetic)
        elif not change.synthetic:
            # A live DELETE: released, or expired at the store. The holder stopped first.
            self.lock_delay.seen_released(time.monotonic())
            self._released.set()
            if self.role is Role.STANDBY:
                self._spawn(self._contend_once_heard())  # take over now

    async def _contend_once_heard(self) -> None:
        """Contends for a lock just released, once what the store said before the release
        has been heard: a switchover that names another standby is set before its holder
        releases the lock, but a lagging delivery could hand the release over first (the
        lock's change takes the turn of an older renewal queued before the switchover's)."""
        await self.client.handed_over(timeout=HEAR_FIRST_S)
        await self.contend()

    def saw_holder(self, holder: bytes | None, *, asked_at: float | None = None) -> None:
        """The lock's holder, as read from the store (not a live notification) by a request
        sent at `asked_at` (monotonic)."""
        self.seen_holder = holder
        self._saw_holder(holder, live=False, asked_at=asked_at)

    def _saw_holder(
        self, holder: bytes | None, *, live: bool, asked_at: float | None = None
    ) -> None:
        if holder is None or holder == self.holder:
            return
        self.lock_delay.seen_held(time.monotonic(), asked_at=asked_at)
        ours = holder_instance(holder) == self.instance_id
        self.last_holder_was_another = not ours
        if not ours or holder in self._duplicates_reported:
            return
        if not live:
            # Found in the store, not set now: most likely the lease of this instance's
            # former process (a restart after a crash), which simply runs out. A process
            # alive with our instance id renews it, and is reported then.
            if holder not in self._former_holders:
                self._former_holders.add(holder)
                log.info(
                    "the lock %s is held by %s, this instance's former process most likely: "
                    "waiting for its lease to end",
                    self.lock_key,
                    holder.decode(errors="replace"),
                )
            return
        self._duplicates_reported.add(holder)
        log.error(
            "another process with instance id %s holds the lock %s (%s): instance ids "
            "must be unique within a pair (a cloned gateway? set AGENT_INSTANCE_ID)",
            self.instance_id,
            self.lock_key,
            holder.decode(errors="replace"),
        )

    def store_kept_its_contents(self, *, lock_absent_at: float | None = None) -> None:
        """The lock was absent, or held this process's own value, and a sync record read
        after it was there.

        Every active writes its records only under the lock delay, so a record that
        survived proves the store did not forget its contents since the last lease could
        have been granted: the lock's absence then means that lease expired or was
        released. No need to wait a TTL (at start, after a link outage) in that case.

        The lock holding this process's own value (its renewals, still in flight when its
        local deadline passed, kept the store's lease; it stepped down and has not driven
        since) is the same case. The value names this process, and only it writes that
        value, with SET NEX: the write that put it there found the lock absent or already
        ours. If another holder held the lock in between, its lease had ended at the store
        (expired, after its own deadline, or released, after it stopped) before that write
        could land; what the wait is for, a store that forgot a lease still running and
        handed the lock out again, is ruled out by the record as above. What this
        process's own former lease sent and may still land carries an older token than its
        new lease, and is refused once the takeover's fences are in, as any former holder's.

        `lock_absent_at`: when the read that found the lock absent was sent, for a record
        read a while after it (at start the devices' keys follow the lock's): the proof
        holds only if nothing since counted as another holder (a live SET of the lock by
        another, a link outage), for the lock is watched from that read on.
        """
        now = time.monotonic()
        if lock_absent_at is not None and self.lock_delay.seen_held_since(lock_absent_at):
            return
        self.lock_delay.seen_released(now)
        self._released.set()  # a takeover waiting out the delay looks again

    def lost_sight(self) -> None:
        """Back from a link outage: what happened at the store meanwhile is unknown."""
        self.lock_delay.lost_sight(time.monotonic())
        self.lock.doubt()

    async def confirm(self) -> bool:
        """After a link outage, as active: renew at once; True once the store confirmed the
        lease (until then nothing is written)."""
        await self.renew()
        return self.lock.confirmed and self.may_drive()


async def _nothing_to_wait_for() -> None:
    return None
