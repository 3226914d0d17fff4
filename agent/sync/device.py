"""The sync of one device: each of its points (the set point, and with a profile the others:
agent.controller.points) kept by a `PointSync` of its own, the device's sync record and its
line's name kept here for all of them.

The points share the unit's place on the bus and the record; each has its own key, mailbox
and worker, so that a change to one point never waits for another's. A routine reading of
the unit (one transaction reads every point) goes to every point it says something new to,
and read-only points a profile puts in the store are published when they moved by their
deadband.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.client.errors import FencingTokenLowerVersion, StateStoreError
from agent.client.lock import LeasedLock, LockNotHeld
from agent.client.session import SessionError
from agent.client.statestore import KeyChange, StateStoreClient
from agent.controller import points
from agent.controller.interface import Controller, ControllerState, PointValue
from agent.controller.profile import SET_POINT_ONLY, Profile
from agent.protocol.hlc import Hlc
from agent.sync.decisions import Deadband, Rules, parsed
from agent.sync.device_record import DeviceRecord
from agent.sync.point import PointSync
from agent.sync.record import InvalidRecord, SyncRecord, parse_full_record
from agent.sync.setpoint_pair import OTHER, SetPointPair
from agent.sync.state_file import StateFile
from agent.sync.status import SyncCounters, SyncStatus

__all__ = ["DeviceKeys", "DeviceSync", "SyncCounters", "SyncStatus"]


@dataclass(frozen=True, slots=True)
class DeviceKeys:
    setpoint: str
    record: str
    line: str
    """Names the device's line, for writers who know only the device."""
    line_id: str
    points: Mapping[str, str] = field(default_factory=dict)
    """Each point's key, the set point's included (filled from `setpoint` when empty)."""
    lock_of_line: Callable[[str], str] | None = None
    """Another line's lock key, by its id: is a line that names itself the device's live?"""

    def of(self, point: str) -> str:
        if point == "setPoint":
            return self.setpoint
        return self.points[point]


class DeviceSync:
    def __init__(
        self,
        device_id: str,
        client: StateStoreClient,
        lock: LeasedLock,
        keys: DeviceKeys,
        state_file: StateFile,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
        may_write: Callable[[], bool],
        profile: Profile = SET_POINT_ONLY,
        after_absence: str = "store",
    ) -> None:
        """`state_file`: the set point's (`<device>.synced.json`); each other point keeps
        one beside it (`<device>.<point>.synced.json`). `after_absence`: who wins when the
        unit comes back from an absence holding other values (decisions.after_absence)."""
        self.device_id = device_id
        self.client = client
        self.lock = lock
        self.keys = keys
        self.profile = profile
        self.log = log
        self._may_write = may_write
        self.record = DeviceRecord(keys.record, lock, may_write)
        self.record.away = lambda: any(point.absent for point in self.points.values())
        self.points: dict[str, PointSync] = {}
        for name in profile.writable:
            self.points[name] = PointSync(
                device_id,
                points.point(name),
                keys.of(name),
                client,
                lock,
                self.record,
                state_file if name == "setPoint" else _beside(state_file, device_id, name),
                log,
                may_write,
                self._rules_for(name),
                after_absence,
            )
            self.points[name].note = self._note
        self.note: Callable[[str, str, str, Hlc | None], None] = lambda *_: None
        """Told of what the line's history keeps: (device, event, words, the lease's token)."""
        self.setpoint = self.points["setPoint"]
        self._pair: SetPointPair | None = None
        if set(OTHER) <= set(self.points):
            self._pair = SetPointPair(
                self.points, profile.deadband, self._last_reading, self._spawn
            )
        self._readings = {
            name: rules.store_deadband
            for name, rules in profile.points.items()
            if rules.store_deadband is not None and not points.point(name).writable
        }
        """Read-only points the profile keeps in the store, with the move that publishes one."""
        self._stored: dict[str, float] = {}
        """Read-only points last published to the store (the profile asks for some)."""
        self._storing: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.served_by: str | None = None
        """Another line that serves this device now (its name in `<device>\\line`, its
        lock held): this line leaves the device alone (a device on two lines is a
        configuration error; fenced by two locks, each line's writes would refuse the
        other's)."""
        self._given_up = asyncio.Event()

    # ------------------------------------------------------------------ the set point's

    @property
    def status(self) -> SyncStatus:
        """The set point's status (the device's, as before profiles)."""
        return self.setpoint.status

    @property
    def controller(self) -> Controller | None:
        return self.setpoint.controller

    @property
    def reconciling(self) -> bool:
        """Held since a takeover and not every point reconciled yet."""
        return self.controller is not None and not all(
            point.reconciled.is_set() for point in self.points.values()
        )

    # ------------------------------------------------------------------ every point

    def start(self) -> None:
        for point in self.points.values():
            point.start()
        if self.served_by is None:
            self._spawn(self._record_once_reconciled())

    async def _record_once_reconciled(self) -> None:
        """The record written once after a takeover, whatever changed: it carries the
        unit's limits, which operators' tools check a value against before writing it."""
        await self.wait_reconciled()
        await self.record.write()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*(point.stop() for point in self.points.values()))

    async def wait_reconciled(self) -> None:
        """Until every point was reconciled after the takeover (each is served as soon
        as it is), or the device was left to another line."""
        reconciled = asyncio.gather(*(point.reconciled.wait() for point in self.points.values()))
        given_up = asyncio.ensure_future(self._given_up.wait())
        try:
            await asyncio.wait([reconciled, given_up], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (reconciled, given_up):
                waiting.cancel()
            await asyncio.gather(reconciled, given_up, return_exceptions=True)

    def reconcile_soon(self) -> None:
        for point in self.points.values():
            point.reconcile_soon()

    def left_line(self) -> None:
        """The unit stopped answering (or the line went): once back, its values are judged
        as a unit's after an absence (decisions.after_absence), by whoever drives the line
        then (the sync record says so, `away`, until the unit is synced again)."""
        self._absent()
        self._spawn(self.setpoint.write_record())

    def _absent(self) -> None:
        for point in self.points.values():
            point.absent = True

    def _note(self, event: str, words: str) -> None:
        self.note(self.device_id, event, words, self.lock.token)

    async def reconcile(self) -> None:
        await asyncio.gather(*(point.reconcile() for point in self.points.values()))

    async def quiesce(self, timeout: float) -> None:
        await asyncio.gather(*(point.quiesce(timeout) for point in self.points.values()))

    def release(self) -> Controller | None:
        controller = self.controller
        for point in self.points.values():
            point.release()
        return controller

    def wants(self, state: ControllerState) -> bool:
        """A reading says something new: to a point (it differs from the last synced
        value) or to the store (a read-only point the profile keeps there moved by its
        deadband). Asked on the bus's thread: it only reads."""
        return any(point.wants(state) for point in self.points.values()) or bool(
            self._to_store(state)
        )

    def polled(self, state: ControllerState, at: float) -> None:
        for point in self.points.values():
            point.polled(state, at)
        for name, value in self._to_store(state).items():
            if name not in self._storing:
                self._storing.add(name)
                self._spawn(self._store_reading(name, value))

    def remote_changed(self, point: str, change: KeyChange) -> None:
        if self._pair is not None and point in OTHER and self._pair.arrived(point, change):
            return  # judged with the other set point's change (agent.sync.setpoint_pair)
        self.points[point].remote_changed(change)

    def _last_reading(self) -> ControllerState | None:
        controller = self.controller
        return None if controller is None else controller.last_state

    def saw_in_store(self, point: str, value: bytes | None, version: Hlc | None) -> None:
        """A change of a point's key delivered to this instance (or its value when the
        watch began), active or standby: kept in the point's history."""
        sync = self.points[point]
        sync.past.history.saw(parsed(sync.point, value), version)

    def follow_value(self, point: str, value: bytes | None, version: Any) -> None:
        self.points[point].follow_value(value, version)

    def follow_change(self, point: str, change: KeyChange) -> None:
        """While standby: a change of a point's key, and the values it took the place of
        before it was delivered (each one the store's, so a candidate for what the
        controller holds at a takeover, see `decisions.takeover_base`)."""
        for value, version in (*change.earlier, (change.value, change.version)):
            self.points[point].follow_value(value, version)

    async def follow_record(self, raw: bytes | None) -> None:
        """While standby: the active's sync record, each point's entry to that point."""
        record = self._parse_record(raw)
        if record is None:
            return
        for name, point in self.points.items():
            await point.follow_record(record.point(name))

    # ------------------------------------------------------------------ taking over

    async def take_over(self, controller: Controller) -> bool:
        """Holds the controller from now on: fences the sync record and the line's name
        (read, and written back with this instance's token; a record the store does not
        have is written from what this instance last synced), names the line if it is not
        named yet, then hands each point its part of the record to fence its own key and
        be reconciled by its worker once `start()`ed. True if the store showed a remote
        change the former active never applied, to any point. A device another line
        serves is left alone (served_by)."""
        if await self.check_served_elsewhere():
            return False
        self.record.forget_doubts()
        # Every key at once, before anything that depends on them: a write the former
        # active sent before its deadline is refused from one round trip on, not once the
        # keys before it are done. The keys of the readings it publishes (its read-only
        # points) among them: a former active paused between its last look at its lease
        # and a write of a reading would otherwise still be accepted.
        readings = [self.keys.of(n) for n in self._readings]
        fences = await asyncio.gather(
            self.setpoint.fence(self.keys.record, "write the sync record to"),
            self.setpoint.fence(self.keys.line, "write the line's name to"),
            *(self.setpoint.fence(key, "write") for key in readings),
            *(point.fence(point.key, "write") for point in self.points.values()),
            return_exceptions=True,
        )
        of_record, of_line = fences[0], fences[1]
        of_points = fences[2 + len(readings) :]
        lost = (LockNotHeld, FencingTokenLowerVersion)
        if isinstance(of_record, lost) or isinstance(of_line, lost):
            for point in self.points.values():
                point.serve_unfenced(controller)
            return False  # lost already: the lock says so
        for key, fenced in zip(readings, fences[2 : 2 + len(readings)], strict=True):
            if isinstance(fenced, (StateStoreError, SessionError)):  # a newer active's token
                self.log.debug("could not fence %s: %s", key, fenced)
            elif isinstance(fenced, BaseException) and not isinstance(fenced, LockNotHeld):
                raise fenced
        record_raw, record_version, line = None, None, None
        for fenced in (of_record, of_line):
            if isinstance(fenced, (StateStoreError, SessionError)):
                self.log.warning("could not read %s: %s", self.keys.record, fenced)
            elif isinstance(fenced, BaseException):
                raise fenced
        if not isinstance(of_record, BaseException) and not isinstance(of_line, BaseException):
            (record_raw, record_version), (line, _) = of_record, of_line
            if record_raw is None:
                await self._record_what_we_know()
        if line != self.keys.line_id.encode():
            await self._name_the_line()
        record = self._parse_record(record_raw)
        if record is not None:
            self.record.refused = record.refused
            if record.away:  # the former active saw the unit leave; nobody saw it back
                self._absent()
        needs = await asyncio.gather(
            *(
                point.take_over(
                    controller,
                    None if record is None else record.point(name),
                    record_version,
                    fenced,
                )
                for (name, point), fenced in zip(self.points.items(), of_points, strict=True)
            )
        )
        return any(needs)

    async def _record_what_we_know(self) -> None:
        """The store has no record of the device (a store that restarted without its
        contents, or a first run): what this instance last synced goes there at once, not
        once the device is reconciled. Reconciling a line can take seconds, a unit that
        does not answer forever; meanwhile the standby, which may have been away when the
        record was lost, would know only an older sync, and take the unit's value, synced
        since, for a panel change made while nobody drove the line."""
        for point in self.points.values():
            if point.status.synced.version is not None:  # never synced: nothing to say
                point.enter_in_record()
        await self.setpoint.write_record()

    async def check_served_elsewhere(self) -> bool:
        """Looks whether another line serves this device now; if so, leaves it alone
        (said once, naming both lines) and returns True. Before any fenced write of the
        device's keys: the other line's token would refuse them."""
        other = await self._other_live_line()
        if other is None:
            if self.served_by is not None:
                self.log.info(
                    "device %s is served by line %s again: line %s no longer serves it",
                    self.device_id,
                    self.keys.line_id,
                    self.served_by,
                )
                self.served_by = None
                self._given_up.clear()
            return False
        if other != self.served_by:
            self.log.error(
                "device %s is configured on line %s and on line %s, which serves it (%s names "
                "it and its lock is held): line %s leaves it alone; remove the device from one "
                "of the two lines' devices",
                self.device_id,
                self.keys.line_id,
                other,
                self.keys.line,
                self.keys.line_id,
            )
        self.served_by = other
        self.release()
        self._given_up.set()
        return True

    async def _other_live_line(self) -> str | None:
        if self.keys.lock_of_line is None:
            return None
        try:
            named, _ = await self.client.get(self.keys.line)
            if named is None or named == self.keys.line_id.encode():
                return None
            other = named.decode(errors="replace")
            holder, _ = await self.client.get(self.keys.lock_of_line(other))
        except (StateStoreError, SessionError) as exc:
            self.log.warning("could not read %s: %s", self.keys.line, exc)
            return self.served_by  # as it was
        return other if holder is not None else None

    async def _name_the_line(self) -> None:
        """`<device>\\line` tells a remote writer which lock fences this device."""
        try:
            await self.lock.fenced_set(self.keys.line, self.keys.line_id)
        except LockNotHeld:
            pass
        except (StateStoreError, SessionError) as exc:
            self.log.warning("could not write the line's name to %s: %s", self.keys.line, exc)

    # ------------------------------------------------------------------ internals

    def _rules_for(self, name: str) -> Callable[[ControllerState], Rules]:
        """What a remote value of `name` must be, given the unit's reading: its limits
        (the set point's as the unit says them, the others' from the profile) and, for a
        heating or cooling set point, the other one's value with the least deadband."""
        point = points.point(name)
        partner_name = {"heatSetPoint": "coolSetPoint", "coolSetPoint": "heatSetPoint"}.get(name)
        if partner_name is not None and partner_name not in self.profile.points:
            partner_name = None

        def rules(state: ControllerState) -> Rules:
            controller = self.controller
            if name == "setPoint":
                limits = None if controller is None else controller.limits
            else:
                limits = self.profile.limits(name)
            if limits is not None:
                self.record.limits[name] = limits
            deadband = None
            if partner_name is not None:
                # The other's new value when both changed in one burst, else the unit's.
                judged_with = {} if self._pair is None else self._pair.judged_with
                other = judged_with.get(partner_name, state.value(partner_name))
                other_value = other if isinstance(other, float) else None
                deadband = Deadband(partner_name, other_value, self.profile.deadband)
            return Rules(point, limits, deadband)

        return rules

    def _to_store(self, state: ControllerState) -> dict[str, float]:
        """Read-only points the profile keeps in the store that moved by their deadband."""
        moved: dict[str, float] = {}
        for name, deadband in self._readings.items():
            value = state.value(name)
            if not isinstance(value, float):
                continue
            last = self._stored.get(name)
            if last is None or abs(value - last) >= deadband:
                moved[name] = value
        return moved

    async def _store_reading(self, name: str, value: PointValue) -> None:
        try:
            if not self._may_write():
                return
            key = self.keys.of(name)
            await self.lock.fenced_set(key, points.encode(points.point(name), value))
            assert isinstance(value, float)
            self._stored[name] = value
        except (LockNotHeld, FencingTokenLowerVersion):
            pass
        except (StateStoreError, SessionError) as exc:
            self.log.debug("could not publish %s: %s", name, exc)
        finally:
            self._storing.discard(name)

    def _parse_record(self, raw: bytes | None) -> SyncRecord | None:
        if raw is None:
            return None
        try:
            return parse_full_record(raw)
        except InvalidRecord as exc:
            self.log.warning("ignoring the sync record in %s: %s", self.keys.record, exc)
            return None

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _beside(state_file: StateFile, device_id: str, point: str) -> StateFile:
    return StateFile(
        Path(state_file.path.parent), f"{device_id}.{point}", point, later=state_file.later
    )
