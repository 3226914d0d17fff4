"""One device's sync record as its points keep it (the format: agent.sync.record).

Each point updates its own entry; a write sends the whole record, fenced with the lock's
token, one write at a time and always the newest entries, so that two points syncing at
once never write each other's entry back to an older value."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agent.client.errors import FencingTokenLowerVersion, NotAuthorized, StateStoreError
from agent.client.lock import LeasedLock, LockNotHeld
from agent.client.session import LostInFlight, SessionError
from agent.client.statestore import SetResult
from agent.controller.interface import Limits, PointValue
from agent.protocol.hlc import Hlc
from agent.sync.decisions import Synced, same, still_pending
from agent.sync.record import InvalidRecord, PointRecord, Refusal, encode_record, parse_full_record


class MarkNotReadBack(StateStoreError):
    """No record went out: the one marking a publish in doubt could not be read back first."""


@dataclass(frozen=True, slots=True)
class MarkedRecord:
    """A point's entry as the store kept it in the record sent behind a publish in doubt,
    and that record's version: the evidence a takeover has (`history.former_publish`)."""

    entry: PointRecord
    version: Hlc


class Written(enum.Enum):
    OK = "written"
    NOT_DRIVING = "not driving"
    FENCED = "refused: a newer active wrote"
    NOT_AUTHORIZED = "not authorized"
    FAILED = "failed"


@dataclass
class DeviceRecord:
    key: str
    lock: LeasedLock
    may_write: Callable[[], bool]
    entries: dict[str, PointRecord] = field(default_factory=dict)
    limits: dict[str, Limits] = field(default_factory=dict)
    refused: Refusal | None = None
    away: Callable[[], bool] = lambda: False
    """The unit left the line and has not synced since (record.SyncRecord.away)."""
    error: Exception | None = None
    """The last write's failure (store error), for the caller's log."""
    _writing: asyncio.Lock = field(default_factory=asyncio.Lock)
    _in_doubt: dict[str, tuple[PointValue, Hlc | None]] = field(default_factory=dict)
    """Per point, a publish whose answer never came (timed out, or its connection lost), and
    the token it went with: its marked record is read back before another record is sent."""
    _read_back: dict[str, MarkedRecord | None] = field(default_factory=dict)
    """Per point, what the read back found, until the point asks (None: no mark there)."""

    def update(
        self,
        point: str,
        synced: Synced,
        pending: tuple[Synced, ...],
        published: PointValue | None = None,
        unanswered: PointValue | None = None,
    ) -> None:
        self.entries[point] = PointRecord(synced, pending, published, unanswered)

    def synced_since(self, point: str, version: Hlc) -> None:
        """The point synced at `version`: a refusal of its older than that is past (status
        no longer shows it)."""
        refused = self.refused
        if refused is None or refused.point != point:
            return
        if refused.version is None or version > refused.version:
            self.refused = None

    async def write(self) -> Written:
        """The record in the store, fenced: the newest entries of every point."""
        if not self.may_write():
            return Written.NOT_DRIVING
        async with self._writing:
            try:
                await self._read_back_marks()
            except (StateStoreError, SessionError) as exc:
                self.error = exc
                return Written.FAILED
            return await self._send()

    def in_doubt(self, point: str) -> bool:
        """A publish of the point's is in doubt and the point has not asked `read_back` yet."""
        return point in self._in_doubt or point in self._read_back

    async def read_back(self, point: str) -> MarkedRecord | None:
        """For a point with a publish in doubt: its entry in the record read back, if that
        record is the one sent behind the publish (it carries its mark and token). None when
        the mark is not there: the record never reached the store (the publish may have).
        Raises the store's error (the doubt stays)."""
        async with self._writing:
            await self._read_back_marks()
            return self._read_back.pop(point, None)

    def forget_doubts(self) -> None:
        """At a takeover: the record it read is the evidence from now on."""
        self._in_doubt.clear()
        self._read_back.clear()

    async def _read_back_marks(self) -> None:
        """Reads the record back while a publish is in doubt, before another record can
        overwrite the mark that tells whether the store had the publish first."""
        if not self._in_doubt:
            return
        raw, version = await self.lock.client.get(self.key)
        try:
            record = None if raw is None else parse_full_record(raw)
        except InvalidRecord:
            record = None
        for point, (value, token) in self._in_doubt.items():
            entry = None if record is None else record.point(point)
            if (
                entry is not None
                and version is not None
                and entry.published_after == token
                and same(entry.published, value)
            ):
                self._read_back[point] = MarkedRecord(entry, version)
            else:
                self._read_back[point] = None
        self._in_doubt.clear()

    async def publish_marked(
        self,
        point: str,
        synced: Synced,
        pending: tuple[Synced, ...],
        value: PointValue,
        publish: Callable[[], Awaitable[SetResult]],
        unanswered: PointValue | None = None,
    ) -> SetResult:
        """Sends `publish()` (the point's write of `value`) and, right behind it on the same
        connection, the record marked with `value`; returns the publish's answer. No other
        record is written until the publish is answered: the mark is in that one record
        only, whose version then tells a takeover that a value the store had before it came
        before the publish (`decisions.published_marker`), and beside the mark the lock's token
        as the publish goes out: the store gives the publish a newer version, if it takes it
        (record.PointRecord.published_after).

        Taken, the point's entry is synced at the value's version before any other record
        goes out (another point's, waiting its turn): a record without the mark and without
        the value would tell a takeover that the unit's value is a panel change still to
        publish."""
        async with self._writing:
            try:
                await self._read_back_marks()
            except (StateStoreError, SessionError) as exc:
                raise MarkNotReadBack(f"{self.key}: {exc}") from exc
            token = self.lock.token
            self.entries[point] = PointRecord(synced, pending, value, unanswered, token)
            sent = asyncio.ensure_future(publish())
            marked = asyncio.ensure_future(self._send())
            after = PointRecord(synced, pending, unanswered=unanswered)
            try:
                try:
                    answer = await sent
                except (TimeoutError, LostInFlight):
                    self._in_doubt[point] = (value, token)
                    raise
                if answer.applied and answer.version is not None:
                    now = Synced(value, answer.version)
                    after = PointRecord(now, still_pending(pending, now))
                return answer
            finally:
                await asyncio.gather(marked, return_exceptions=True)
                self.entries[point] = after

    async def _send(self) -> Written:
        if not self.may_write():
            return Written.NOT_DRIVING
        setpoint = self.entries.get("setPoint")
        if setpoint is None or setpoint.synced.value is None or setpoint.synced.version is None:
            # Nothing synced yet (a first run): a record of pending writes alone cannot
            # be written, so a write in doubt is known to this instance only.
            return Written.OK
        others = {name: e for name, e in self.entries.items() if name != "setPoint"}
        raw = encode_record(
            setpoint.synced,
            setpoint.pending,
            points=others,
            limits=self.limits,
            refused=self.refused,
            published=setpoint.published,
            unanswered=setpoint.unanswered,
            published_after=setpoint.published_after,
            away=self.away(),
        )
        try:
            await self.lock.fenced_set(self.key, raw)
        except FencingTokenLowerVersion:
            return Written.FENCED
        except LockNotHeld:
            return Written.NOT_DRIVING
        except NotAuthorized as exc:
            self.error = exc
            return Written.NOT_AUTHORIZED
        except (StateStoreError, SessionError) as exc:
            self.error = exc
            return Written.FAILED
        return Written.OK
