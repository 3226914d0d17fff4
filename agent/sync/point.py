"""The sync of one point of one device (`setPoint`, or another a profile gives it): reads
the controller and the store, asks `decisions`, and carries out the answer. One operation
at a time, so that decisions see a settled state.

It lives as long as the process. While standby it follows the store: the point's values it
sees and the sync record of the active, so that on takeover it knows what the former active
last had on the controller. While active it holds the controller (its place on the bus),
keeps both sides equal, and writes the device's sync record after every sync (device_record).

Work arrives in a mailbox with one slot per kind (the newest remote change, the newest
poll reading that differs, a request to reconcile), served by one task per point: a burst
of changes to one point collapses to the newest, and points never wait for each other
except on the line itself.

A remote change is decided on the newest reading of the controller, and its write goes out
only if the controller still holds what the decision saw (the bus reads it right before
the write): a panel change made meanwhile is decided on again, never written over. Before
the write goes out it is recorded as pending, in the store's sync record too, so that a
write whose answer never came, or one a former active made before it was cut off, is never
taken for a panel change later (`decisions.settled`). A remote value the unit cannot take
is refused: the key gets the unit's value back (fenced) and the refusal is recorded with
its reason in the sync record, where operators' tools read it. How each decision is
carried out, the writes, is agent.sync.point_writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from agent.client.errors import FencingTokenLowerVersion, StateStoreError
from agent.client.lock import LeasedLock, LockNotHeld
from agent.client.session import SessionError
from agent.client.statestore import KeyChange, StateStoreClient
from agent.controller.interface import (
    Controller,
    ControllerFault,
    ControllerState,
    PointValue,
)
from agent.controller.points import Point
from agent.protocol.hlc import Hlc
from agent.sync import decisions
from agent.sync.decisions import (
    ApplyToController,
    Decision,
    Rules,
    Synced,
)
from agent.sync.device_record import DeviceRecord, MarkedRecord
from agent.sync.fence import Fenced, fence, outcome
from agent.sync.point_writes import PointWrites
from agent.sync.recollection import Recollection, StoreReading
from agent.sync.record import PointRecord
from agent.sync.state_file import StateFile
from agent.sync.status import SyncStatus
from agent.sync.store_errors import StoreErrors

Decide = Callable[[PointValue, Rules], Decision]
"""Decides on the point's value as the unit holds it and the rules a remote value keeps."""
_DECIDE_AGAIN = 3
"""How often a remote change is decided anew on a newer reading before it waits for the
next event."""


class PointSync(PointWrites):
    """Moves one point between one controller and its key, as the lock's holder."""

    def __init__(
        self,
        device_id: str,
        point: Point,
        key: str,
        client: StateStoreClient,
        lock: LeasedLock,
        record: DeviceRecord,
        state_file: StateFile,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
        may_write: Callable[[], bool],
        rules: Callable[[ControllerState], Rules],
        after_absence: str = "store",
    ) -> None:
        """`rules(state)`: what a remote value must be, given the unit's reading (its
        limits; for a heating or cooling set point, the other one's value); `after_absence`:
        who wins when the unit comes back from an absence holding another value (store or
        unit, decisions.after_absence)."""
        self.device_id = device_id
        self.point = point
        self.name = point.name
        self.key = key
        self.client = client
        self.lock = lock
        self.record = record
        self.state_file = state_file
        self._rules = rules
        self.after_absence = after_absence
        self.absent = False
        """The unit left the line (unplugged, reset, powered off): the first decision once it
        answers again is decisions.after_absence's."""
        self.note: Callable[[str, str], None] = lambda event, words: None
        """Told of what the line's history keeps (event, words): a unit back from an
        absence, a remote value refused."""
        synced = state_file.load()
        self.status = SyncStatus(
            synced=synced, pending=decisions.still_pending(state_file.load_pending(), synced)
        )
        self.log = log
        self._errors = StoreErrors(self.status.counters, log)
        self._may_write = may_write
        self._busy = asyncio.Lock()
        self.past = Recollection(point)
        self.controller: Controller | None = None
        # The mailbox: the newest of each kind of work, and what wakes the worker.
        self._remote: tuple[float, KeyChange] | None = None  # (arrived, monotonic), change
        self._reading: tuple[float, ControllerState] | None = None
        self._reconcile_wanted = False
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._decide_as_takeover: Synced | None = None
        """The next decision is a takeover's, on this base (what the former active last
        had): after a takeover, and after our own publish in doubt (its record read back)."""
        self._decide_at_next_reading = False
        """A remote change's write was not carried out (unanswered, or not sent): the unit's
        next reading reconciles the point, whatever it holds."""
        self._unanswered: PointValue | None = None
        """Our own publish whose answer never came, until the point syncs again."""
        self.reconciled = asyncio.Event()
        """Set once the device was reconciled after the takeover: it is served."""

    # ------------------------------------------------------------------ the mailbox

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.create_task(
                self._serve(), name=f"sync {self.device_id} {self.name}"
            )

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None

    def remote_changed(self, change: KeyChange) -> None:
        """A change of the point's key, while active: applied by the worker (a newer one
        arriving first takes its place)."""
        self._remote = (time.monotonic(), change)
        self._wake.set()

    def polled(self, state: ControllerState, at: float) -> None:
        """A routine poll's reading, ended on the wire at `at` (monotonic): work only if it
        differs from the last synced value, or a write was not carried out (reconciled)."""
        if self.controller is None:
            return
        self.status.controller = "ok"
        if not self.wants(state):
            return
        if self._decide_at_next_reading:
            self._decide_at_next_reading = False
            self.reconcile_soon()
            return
        if self._reading is None or at >= self._reading[0]:
            self._reading = (at, state)
        self._wake.set()

    def wants(self, state: ControllerState) -> bool:
        """A reading says something new to this point: it differs from the last synced
        value, or it is the first since a write was not carried out. (Asked on the bus's
        thread too: it only reads.)"""
        value = state.value(self.name)
        return value is not None and (
            self._decide_at_next_reading or not decisions.same(value, self.status.synced.value)
        )

    def reconcile_soon(self) -> None:
        """Compare store, controller and last synced state again (after a reconnect, or a
        controller that answers again)."""
        self._reconcile_wanted = True
        self._wake.set()

    async def _serve(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            # Between a takeover's start and its fence, nothing is decided: a remote change
            # or reading handled then was judged on the base this instance had as standby,
            # not on the takeover's (what the former active last had on the controller), and
            # a value the former active had published was taken for a panel change.
            while self.controller is not None and (
                self._decide_as_takeover is not None or self.reconciled.is_set()
            ):
                try:
                    if self._decide_as_takeover is not None:
                        record, self._decide_as_takeover = self._decide_as_takeover, None
                        decided = await self._reconcile_at_takeover(record)
                        self.reconciled.set()
                        if not decided and self.controller is not None:
                            # The store or the unit did not answer: the takeover's base
                            # still decides, at the next event (a reading, a change).
                            self._decide_as_takeover = record
                            break
                    elif self._reconcile_wanted:
                        self._reconcile_wanted = False
                        await self.reconcile()
                    elif self._remote is not None:
                        (arrived, change), self._remote = self._remote, None
                        await self.on_remote_change(change, arrived)
                    elif self._reading is not None:
                        (at, state), self._reading = self._reading, None
                        await self._on_reading(at, state)
                    else:
                        break
                except Exception:
                    # A bug must not end the device's sync: say so and carry on.
                    self.log.exception("%s sync failed; carrying on", self.name)

    # ------------------------------------------------------------------ standby

    def follow_value(self, value: bytes | None, version: Hlc | None) -> None:
        """While standby: a value the store held (see Recollection)."""
        self.past.follow_value(value, version)

    async def follow_record(self, entry: PointRecord | None) -> None:
        """While standby: the point's entry in the active's sync record, kept as our own
        last synced state (on disk too), so that a restart or a takeover knows it even if
        the store forgets."""
        if entry is None:
            return
        self.past.follow_entry(entry)
        synced = decisions.newer(self.status.synced, entry.synced)
        pending = decisions.still_pending((*self.status.pending, *entry.pending), synced)
        if (synced, pending) != (self.status.synced, self.status.pending):
            # A write of the active's newly pending is saved at once, as the active saves
            # it; a sync may wait for the next batch.
            new_write = not set(pending) <= set(self.status.pending)
            self.status.synced, self.status.pending = synced, pending
            await self._save_locally(now=new_write)

    # ------------------------------------------------------------------ taking over

    async def take_over(
        self,
        controller: Controller,
        entry: PointRecord | None,
        marked_at: Hlc | None = None,
        fenced: Fenced | None = None,
    ) -> bool:
        """Holds the controller from now on: reads the point's key and writes it back with
        this instance's token (the fence), and leaves the point to be reconciled by its
        worker, once `start()`ed (`reconciled` is set then). `entry`: the point's part of
        the record the device read and fenced, `marked_at` that record's version. True if
        the store showed a remote change the former active never applied (a device to
        reconcile first); False also when the store could not be read. `fenced`: the key
        fenced already, with every other key of the line at once (sync.fence.Fenced)."""
        self.controller = controller
        self.reconciled.clear()
        try:
            store_raw, store_version = await outcome(fenced or self.fence(self.key, "write"))
        except (LockNotHeld, FencingTokenLowerVersion):
            self.serve_unfenced(controller)
            return False
        except (StateStoreError, SessionError) as exc:
            self._errors.failed(exc, self.key, "read")
            self.reconcile_soon()
            self.reconciled.set()
            return False
        if entry is not None:
            self.status.pending = decisions.still_pending(
                (*self.status.pending, *entry.pending), self.status.synced
            )
        synced = self.status.synced if entry is None else entry.synced
        refused = False
        if entry is not None:
            store = StoreReading(store_raw, store_version, self.client.delivered_since(self.key))
            refused = not self.past.take_former_publish(entry, marked_at, store)
            if refused:
                self.log.info(
                    "takeover: the former active's publish of %s %s never reached the store "
                    "(refused): the controller's value is a panel change still to publish",
                    self._what,
                    entry.published,
                )
        # Until the takeover's reconcile decides, every record names the publish it counts as
        # the store's (a store that lost its contents lost the record that named it).
        self.enter_in_record(synced=decisions.newer(self.status.synced, synced))
        if refused:
            # Said in the store at once, the marker dropped: the fences just rewrote the key
            # after the record, so that to the next takeover the key looks newer than the
            # marker, a refused publish like an accepted one with a remote change after it
            # (a 15-minute soak: this instance frozen before its next record, the next
            # active wrote the remote change over the panel change).
            await self.write_entered()
        self._decide_as_takeover = synced
        self._wake.set()
        return store_version is not None and (
            synced.version is None or store_version > synced.version
        )

    async def _reconcile_at_takeover(self, record: Synced | None) -> bool:
        """Brings the three together: what the former active last had on the controller
        (its record, a write of its still pending, or a value seen in the store since), the
        store, and the controller. False if it could not decide (nothing read). Run too for
        a publish of ours in doubt, once its record is read back (see _publish)."""
        pending = self.status.pending
        async with self._busy:
            # Read inside the operation: the fence's reading may be old by now (a remote
            # change made since must not be taken for an empty or older store).
            try:
                store_raw, store_version = await self.client.get(self.key)
            except (StateStoreError, SessionError) as exc:
                self._errors.failed(exc, self.key, "read")
                return False
            if self.record.in_doubt(self.name):
                try:
                    marked = await self.record.read_back(self.name)
                except (StateStoreError, SessionError) as exc:
                    self._errors.failed(exc, self.record.key, "read")
                    return False
                self._own_publish(marked, store_raw, store_version)

            first_reading = True

            def decide(value: PointValue, rules: Rules) -> Decision:
                nonlocal first_reading
                if not first_reading:
                    # Deciding again: the write found the unit changed since this instance
                    # read it, at its panel. The base was taken on the first reading; taken
                    # on this one, a value the store held long ago that the unit holds
                    # again would pass for a sync, and the change be written over.
                    return self._judge(self.status.synced, store_raw, store_version, value, rules)
                first_reading = False
                base = self.past.base(self.status.synced, record, pending, value)
                if base != self.status.synced:
                    self.log.info(
                        "the store had our unanswered publish of %s %s before its value now"
                        if self.past.own_doubt
                        else "takeover: the former active last synced %s %s",
                        self._what,
                        base.value,
                    )
                    self.status.synced = base
                return self._judge(base, store_raw, store_version, value, rules)

            decided = await self._run_locked("takeover", decide)
        if decided:
            self.past.decided()
            self.enter_in_record()
        return decided

    def _own_publish(
        self, marked: MarkedRecord | None, store_raw: bytes | None, store_version: Hlc | None
    ) -> None:
        """Our publish whose answer never came, counted as the store's if the record sent
        behind it marks it (unless the store refused it): a remote change after it wins."""
        if marked is None:
            self.log.info(
                "the record sent behind our unanswered publish of %s is not in the store: "
                "the controller's value is a panel change still to publish",
                self._what,
            )
        entry, marked_at = (None, None) if marked is None else (marked.entry, marked.version)
        store = StoreReading(store_raw, store_version, self.client.delivered_since(self.key))
        self.past.take_own_publish(entry, marked_at, store)

    async def fence(self, key: str, writing: str) -> tuple[bytes | None, Hlc | None]:
        """`key` fenced with this instance's token (agent.sync.fence); the point's own key
        gets back the newest value it held if the store went back in time."""
        restore = self.past.newest_held(self.status.synced) if key == self.key else None
        return await fence(self.client, self.lock, self._errors, key, writing, restore)

    def serve_unfenced(self, controller: Controller) -> None:
        """Holds the controller without a fence: the lock said the lease was lost before
        it (the step-down hands the controller back). Left to a reconcile, should the lease
        still be ours."""
        self.controller = controller
        self.reconcile_soon()
        self.reconciled.set()

    def release(self) -> Controller | None:
        """Stepping down: hands back the controller, drops pending work (the next reconciles)."""
        controller, self.controller = self.controller, None
        self._remote, self._reading, self._reconcile_wanted = None, None, False
        self._decide_at_next_reading = False
        self._decide_as_takeover = None
        self.reconciled.clear()
        return controller

    # ------------------------------------------------------------------ events (active)

    async def on_remote_change(self, change: KeyChange, arrived: float | None = None) -> None:
        """A change of the point's key; `arrived` (monotonic) when it reached the agent: a
        reading taken since then may stand for a fresh read of the controller."""
        value, version = change.value, change.version
        if value is None or version is None or self.absent:
            # A delete, or a change found without its version: compare the three anew
            # (a deleted key gets the controller's value back).
            if change.kind == "DELETE":
                self.log.info("%s key deleted in the store: publishing it again", self.name)
            await self.reconcile()
            return
        async with self._busy:
            decided = await self._run_locked(
                "remote change",
                lambda current, rules: decisions.on_remote_change(
                    self.status.synced, value, version, current, rules
                ),
                since=time.monotonic() if arrived is None else arrived,
            )
        if not decided:
            self.reconcile_soon()  # the unit unread (a reply lost): the store still has it

    async def poll(self) -> None:
        """Reads the controller now (urgent) and publishes a local change."""
        await self._run("poll", lambda current, _: decisions.on_poll(self.status.synced, current))

    async def _on_reading(self, at: float, state: ControllerState) -> None:
        if self.absent:  # the unit's first reading back: the store decides with it
            await self.reconcile()
            return
        async with self._busy:
            controller = self.controller
            if controller is None or not self._may_write():
                return
            written = controller.last_write_at
            if written is not None and at < written:
                return  # read before our last write went out: stale
            newest_at = controller.last_state_at
            if newest_at is not None and newest_at > at and controller.last_state is not None:
                # A newer reading exists (another operation read the unit while this one
                # waited in the mailbox): a decision on the older one would be stale.
                state, at = controller.last_state, newest_at
            value = state.value(self.name)
            if value is None:
                return
            await self._settle(value)
            decision = decisions.on_poll(self.status.synced, value)
            await self._carry_out("poll", decision, value, at)

    async def reconcile(self) -> None:
        async with self._busy:
            if self.controller is None or not self._may_write():
                return
            # Read inside the operation: a store value read before another operation
            # changed it would be stale by the time it is compared.
            try:
                raw, version = await self.client.get(self.key)
            except (StateStoreError, SessionError) as exc:
                self._errors.failed(exc, self.key, "read")
                return
            await self._run_locked(
                "reconcile",
                lambda current, rules: self._judge(
                    self.status.synced, raw, version, current, rules
                ),
            )

    def _judge(
        self, base: Synced, raw: bytes | None, version: Hlc | None, value: PointValue, rules: Rules
    ) -> Decision:
        """A reconcile's decision; on a unit back from an absence, decisions.after_absence's
        until the point is synced again (`_record` ends the absence; a write held back is
        decided so again)."""
        if not self.absent:
            return decisions.reconcile(base, raw, version, value, rules)
        decision = decisions.after_absence(self.after_absence, base, raw, version, value, rules)
        words = decisions.absence_words(decision)
        if words is not None:
            self.log.warning("%s %s", self._what, words)
            self.note("unit back", f"{self.name} {words}")
        return decision

    async def quiesce(self, timeout: float) -> None:
        """Waits for the operation in progress and lets no other start."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._busy.acquire()

    # ------------------------------------------------------------------ carrying out

    async def _run(self, what: str, decide: Decide) -> None:
        async with self._busy:
            await self._run_locked(what, decide)

    async def _run_locked(self, what: str, decide: Decide, *, since: float | None = None) -> bool:
        """Reads the controller (or takes its newest reading, if taken after `since`),
        decides and carries the decision out; a write goes out only if the unit still holds
        what the decision saw, and one that finds it changed is decided again on the new
        reading. False when nothing was decided (the unit unread, away, or not driven).

        With `since` (a remote change's arrival), an older reading is decided on too when
        the decision is a write: the bus reads the unit right before the write goes out
        (its `fresh_after`), so that read confirms it, and the read a decision would take
        first is the same transaction one hop sooner. Any other decision on it is made
        again on a fresh reading."""
        controller = self.controller
        if controller is None or not self._may_write():
            return False
        started = time.monotonic() if since is None else since
        state = controller.last_state
        state_at = controller.last_state_at
        written = controller.last_write_at
        older = state_at is None or state_at < started
        before_write = written is not None and state_at is not None and state_at < written
        if state_at is None or before_write or (older and since is None):
            # None yet, not one since `started` for an operation of its own, or one from
            # before a write that went unanswered and may have landed since: deciding on
            # that would record the value the write replaced and drop the write from those
            # pending, so that the unit holding it later is taken for a panel change.
            state, older = await self._read(controller, what), False
            if state is None:
                return False
        if controller.limits is None:
            try:
                await controller.read_limits()
            except ControllerFault as exc:
                self._unreadable(what, exc)
                return False
        self.status.controller = "ok"
        decided = 0
        while decided < _DECIDE_AGAIN:
            value = state.value(self.name)
            if value is None:
                self.log.warning("%s: the unit's reading has no %s", what, self.name)
                return False
            await self._settle(value)
            if controller.limits is None:
                # The unit left the line since its limits were read: a remote value is not
                # judged without them (refused, a panel value would be restored over it).
                self.log.debug("%s: the unit is away; deciding when it is back", what)
                return False
            decision = decide(value, self._rules(state))
            if older and not isinstance(decision, ApplyToController):
                # Decided on a reading from before the change, and not a write that reads
                # the unit itself: the unit may have been changed at its panel since.
                state, older = await self._read(controller, what), False
                if state is None:
                    return False
                continue
            decided += 1
            changed = await self._carry_out(what, decision, value, started)
            if changed is None or self.controller is None or not self._may_write():
                return True
            self.log.info(
                "%s: the controller's %s changed to %s before the write went out: deciding again",
                what,
                self.name,
                changed.value(self.name),
            )
            state, older = changed, False
        return True

    async def _read(self, controller: Controller, what: str) -> ControllerState | None:
        """The unit's whole state now, in one exchange (telemetry reports it too); None
        when it does not answer."""
        try:
            return await controller.read_state()
        except ControllerFault as exc:
            self._unreadable(what, exc)
            return None

    def _unreadable(self, what: str, exc: ControllerFault) -> None:
        self.status.controller_fault(exc)
        self.log.debug("%s: controller not readable: %s", what, exc)

    async def _settle(self, controller_value: PointValue) -> None:
        """A controller that holds a write of ours still pending holds our write, not a
        panel change: synced at that write's version from now on."""
        base = decisions.settled(self.status.synced, self.status.pending, controller_value)
        if base != self.status.synced and base.value is not None:
            said = "the controller holds %s %s, written by the agent (version %s): synced"
            self.log.info(said, self.name, base.value, base.version)
            await self._record(base.value, base.version)
