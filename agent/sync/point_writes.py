"""How a point's sync carries out a decision (agent.sync.point): a remote change written to
the controller (recorded as pending first, in the sync record too), the unit's value
published to its key (fenced, the record marking it sent right behind), a refusal
recorded with the unit's value restored, and a sync remembered on disk and in the store.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

from agent.client.errors import FencingTokenLowerVersion, StateStoreError
from agent.client.lock import LeasedLock, LockNotHeld
from agent.client.session import SessionError
from agent.client.statestore import Condition
from agent.controller import points
from agent.controller.interface import (
    Controller,
    ControllerFault,
    ControllerState,
    NotReadBeforeWrite,
    NotSent,
    PointValue,
    ReadingChanged,
    WriteNotAllowed,
)
from agent.controller.points import Point
from agent.protocol.hlc import Hlc
from agent.sync import decisions, status
from agent.sync.decisions import (
    ApplyToController,
    Decision,
    Ignore,
    PublishToStore,
    Record,
    Reject,
    Synced,
)
from agent.sync.device_record import DeviceRecord, Written
from agent.sync.recollection import Recollection
from agent.sync.record import Refusal
from agent.sync.state_file import StateFile
from agent.sync.status import PANEL, RESTORE, SyncStatus
from agent.sync.store_errors import StoreErrors

SOURCES = {
    PANEL: status.FROM_PANEL,
    RESTORE: status.RESTORED_AFTER_REFUSAL,
    status.REMOTE: status.FROM_REMOTE,  # a rounded value: the remote change's
}
"""A published value's change source, by the write's origin."""


class PointWrites:
    """The writing half of PointSync: what it needs of the sync, and the writes."""

    name: str
    point: Point
    key: str
    lock: LeasedLock
    record: DeviceRecord
    state_file: StateFile
    status: SyncStatus
    log: logging.Logger | logging.LoggerAdapter[logging.Logger]
    controller: Controller | None
    past: Recollection
    absent: bool
    _errors: StoreErrors
    _may_write: Callable[[], bool]
    _unanswered: PointValue | None
    _decide_as_takeover: Synced | None
    _decide_at_next_reading: bool
    _wake: asyncio.Event
    note: Callable[[str, str], None]

    def reconcile_soon(self) -> None:
        raise NotImplementedError

    async def _carry_out(
        self, what: str, decision: Decision, controller_value: PointValue, read_after: float
    ) -> ControllerState | None:
        """Carries out `decision`; the newest reading if a write found the unit changed."""
        if isinstance(decision, Ignore):
            self.log.debug("%s: %s", what, decision.reason)
        elif isinstance(decision, Reject):
            await self._refuse(what, decision)
        elif isinstance(decision, Record):
            await self._record(decision.value, decision.version)
        elif isinstance(decision, PublishToStore):
            source = status.UNITS_AFTER_ABSENCE if decision.after_absence else status.FROM_PANEL
            await self._publish(
                decision.value,
                decision.reason,
                only_if_absent=decision.only_if_absent,
                source=source,
            )
        elif isinstance(decision, ApplyToController):
            return await self._apply(decision, controller_value, read_after)
        return None

    async def _refuse(self, what: str, decision: Reject) -> None:
        """A value the unit cannot take: refused and recorded with why, and the key gets
        the unit's value back, so that the store never shows a value as if it held."""
        self.status.counters.invalid_remote_values += 1
        self.status.wrote(status.REMOTE, status.REFUSED)
        shown = decision.value[:32].decode("ascii", errors="backslashreplace")
        said = "%s: %s %r refused (%s); the store gets the unit's %s back"
        self.log.warning(said, what, self.name, shown, decision.reason, decision.restore)
        self.note("refused", f"{self.name} {shown} refused ({decision.reason})")
        # The refusal first, in every record from now on: a writer waiting on the record must
        # not take the restore's sync (no sync since: it answers the refusal) for its value.
        self.record.refused = Refusal(self.name, shown, decision.version, decision.reason)
        if decision.restore is not None:
            await self._publish(decision.restore, f"{shown} refused: {decision.reason}", RESTORE)
        await self.write_record()

    async def _apply(
        self, decision: ApplyToController, controller_value: PointValue, read_after: float
    ) -> ControllerState | None:
        intent = Synced(decision.value, decision.version)
        pending = decisions.still_pending((*self.status.pending, intent), self.status.synced)
        # The write is recorded before it goes out, in the store and on disk at once: a
        # write whose answer never comes, or one this instance makes just before it is cut
        # off, is known to be the agent's.
        recorded, _ = await asyncio.gather(
            self.write_record(pending), self._save_locally(pending=pending)
        )
        if not recorded:
            self.log.info("write of %s held back: its pending record was not written", intent.value)
            await self._save_locally()  # the disk without it again
            return None
        self.status.pending = pending
        controller = self.controller
        if controller is None:  # handed back while the record was written (stepped down)
            self._forget_pending(intent)
            return None
        try:
            readback = await controller.write_point(
                self.name,
                decision.value,
                allowed=self._may_write,
                expected=controller_value,
                fresh_after=read_after,
            )
        except ReadingChanged as exc:
            self._forget_pending(intent)
            return exc.state
        except (WriteNotAllowed, NotSent) as exc:
            self._forget_pending(intent)  # nothing went out
            self.status.wrote(status.REMOTE, status.NOT_SENT)
            self.log.info("write of %s not sent: %s", decision.value, exc)
            # Still driving (the lease would not cover it, say): the store keeps the change,
            # and the unit's next reading, which holds the synced value, is no news by itself.
            self._decide_at_next_reading = True
            if isinstance(exc, NotReadBeforeWrite):
                self.reconcile_soon()  # the unit missed a read: asked again at once
            return None
        except ControllerFault as exc:
            # It may have reached the controller all the same: it stays pending, and the
            # next reading tells (it holds the write, or the change is decided again).
            self.status.controller_fault(exc)
            self.status.wrote(status.REMOTE, status.NOT_CONFIRMED)
            self.log.warning("could not apply %s %s: %s", self._what, decision.value, exc)
            self._decide_at_next_reading = True
            return None
        self.status.wrote(status.REMOTE, status.APPLIED, changed_ms=decision.version.wall_ms)
        said = "applied remote %s %s to the controller (version %s)"
        self.log.info(said, self._what, readback, decision.version)
        restored = decision.after_absence is not None
        self.status.changed(
            status.RESTORED_AFTER_ABSENCE if restored else status.FROM_REMOTE, decision.version
        )
        await self._record(readback, decision.version)
        if decision.correct_store or not decisions.same(readback, decision.value):
            await self._publish(readback, "the controller keeps a rounded value", status.REMOTE)
        return None

    def _forget_pending(self, intent: Synced) -> None:
        self.status.pending = tuple(p for p in self.status.pending if p != intent)

    @property
    def _what(self) -> str:
        """The point as the log names it ("set point" for the set point, as always)."""
        return "set point" if self.name == "setPoint" else self.name

    async def _publish(
        self,
        value: PointValue,
        why: str,
        origin: str = PANEL,
        *,
        only_if_absent: bool = False,
        source: str | None = None,
    ) -> None:
        """`origin` counts the write; `source` is the change's (status.LastChange), by
        default the origin's."""
        if not self._may_write():
            return
        # The record marking the value goes right behind it on the same connection (both
        # sent before either answer is awaited): a record with the mark in the store means
        # the store had the value first, so a takeover knows a later value there is newer,
        # even if this instance dies before the version comes back. Unless the store refused
        # the value: its value is then older than that record (decisions.published_marker).
        try:
            result = await self.record.publish_marked(
                self.name,
                self.status.synced,
                self.status.pending,
                value,
                functools.partial(
                    self.lock.fenced_set,
                    self.key,
                    points.encode(self.point, value),
                    condition=Condition.NX if only_if_absent else None,
                ),
                self._unanswered,
            )
        except FencingTokenLowerVersion:
            # The lock counts the lease lost (a renewal of ours would have explained it).
            self.status.counters.fenced_writes_rejected += 1
            self.status.wrote(origin, status.REFUSED)
            self.log.warning("store refused our write of %s: a newer active wrote", value)
            return
        except LockNotHeld:
            return
        except (StateStoreError, SessionError) as exc:
            self._errors.failed(exc, self.key, "write")
            self.status.wrote(origin, status.NOT_CONFIRMED)
            if isinstance(exc, TimeoutError):
                # Unanswered: the store may have it. Every record from now on says so,
                # until the point syncs again (a takeover must not take the value for a
                # panel change).
                self._unanswered = value
                await self.write_record()
            if self.record.in_doubt(self.name):
                # The store may have it and a remote change after it: the next decision is
                # made as a takeover's, on the record sent behind it, read back first (once
                # connected again: the reconnect wakes the worker).
                self._decide_as_takeover = self.status.synced
                if isinstance(exc, TimeoutError):
                    self._wake.set()
            return
        self._errors.allowed(self.key)
        self.status.wrote(origin, status.APPLIED if result.applied else status.NOT_SENT)
        if not result.applied:
            # Written meanwhile (a remote change to an empty store): compare anew, with the
            # value read as the base if nothing was synced yet.
            self.log.info("%s %s not published: the store has one now", self._what, value)
            self.status.synced = decisions.base_after_a_lost_race(self.status.synced, value)
            self.reconcile_soon()
            return
        said = "published %s %s to the store (%s, version %s)"
        self.log.info(said, self._what, value, why, result.version)
        self.status.changed(source or SOURCES[origin], result.version)
        await self._record(value, result.version, origin == RESTORE)

    async def _record(self, value: PointValue, version: Hlc | None, restores: bool = False) -> None:
        """Both sides agree on `value` at `version`: remember it, on disk and in the store
        (the sync record, for whoever takes over next)."""
        synced = Synced(value, version)
        pending = decisions.still_pending(self.status.pending, synced)
        # Synced again: an absence is over, and the record says so (no longer `away`).
        ended_absence, self.absent = self.absent, False
        if (synced, pending) == (self.status.synced, self.status.pending) and not ended_absence:
            return
        # A sync that settles a write of ours may wait for the next batch of saves: the
        # write's pending entry, saved before it went out, already tells a restart whose the
        # unit's value is. Any other (a published panel change) is saved before the record
        # says it: a standby, or this instance restarted, must never know a sync the disk
        # lost once the store has forgotten it too.
        settles_ours = version is not None and version in (p.version for p in self.status.pending)
        self.status.synced, self.status.pending = synced, pending
        self.status.synced_at = time.time()
        await self._save_locally(now=not settles_ours)
        if version is not None:
            self._unanswered = self.past.published = None  # synced at a store version: settled
            if not restores:  # a restore answers a refusal: it is no sync since
                self.record.synced_since(self.name, version)
            await self.write_record()

    def enter_in_record(
        self, pending: tuple[Synced, ...] | None = None, *, synced: Synced | None = None
    ) -> None:
        """Its last sync (or `synced`) and `pending` (else its writes in doubt) as its record
        entry; beside them a publish the store may have: while a takeover is not reconciled
        yet, the one it counts as the store's (see take_over), else our own unanswered one."""
        pending = self.status.pending if pending is None else pending
        synced = self.status.synced if synced is None else synced
        published = self.past.published
        unanswered = published if published is not None else self._unanswered
        self.record.update(self.name, synced, pending, unanswered=unanswered)

    async def write_record(self, pending: tuple[Synced, ...] | None = None) -> bool:
        """The device's sync record in the store with this point's entry, fenced; True once
        the store has it (or the broker's rules refuse it: nobody reads it then)."""
        self.enter_in_record(pending)
        return await self.write_entered()

    async def write_entered(self) -> bool:
        """The device's sync record in the store as its entries stand (write_record)."""
        written = await self.record.write()
        if written is Written.FENCED:
            self.status.counters.fenced_writes_rejected += 1
            self.log.warning("store refused our sync record: a newer active wrote")
        elif written in (Written.NOT_AUTHORIZED, Written.FAILED):
            assert self.record.error is not None
            self._errors.failed(self.record.error, self.record.key, "write the sync record to")
            return written is Written.NOT_AUTHORIZED
        elif written is Written.OK:
            self._errors.allowed(self.record.key)
        return written is Written.OK

    async def _save_locally(
        self, *, now: bool = True, pending: tuple[Synced, ...] | None = None
    ) -> None:
        """`now`: before a write goes out (its pending entry, `pending` if given); else a
        sync, which may wait for the next batch of saves (agent.sync.state_file)."""
        state = self.status.synced, self.status.pending if pending is None else pending
        try:
            if now:
                await self.state_file.store(*state)
            else:
                await self.state_file.store_soon(*state)
        except OSError as exc:
            self.log.warning("could not save the synced state: %s", exc)
