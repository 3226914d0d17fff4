"""What one point's sync remembers of its key's past, to tell a value the store had from a
panel change when it cannot see the store's history: at a takeover, and after a publish of
its own whose answer never came. Plain state and decisions, no I/O.

- the values of the key it saw while standby (the former active may have synced one of them
  after its last record: `decisions.takeover_base`);
- the publish it counts as the store's until it has decided: the one the former active's
  record marks, or its own in doubt, judged by the record sent behind it;
- every change of the key delivered to it, in either role (`history.StoreHistory`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from agent.controller.interface import PointValue
from agent.controller.points import Point
from agent.protocol.hlc import Hlc
from agent.sync import decisions
from agent.sync.decisions import Synced
from agent.sync.history import StoreHistory
from agent.sync.record import PointRecord


@dataclass(frozen=True, slots=True)
class StoreReading:
    """The point's key as read from the store, and the version since which every change of
    it reached this instance (StateStoreClient.delivered_since)."""

    raw: bytes | None
    version: Hlc | None
    whole_since: Hlc | None


SEEN_WHILE_STANDBY = 64
"""A point's values kept while standby, newest last (see `decisions.takeover_base`)."""


class Recollection:
    def __init__(self, point: Point) -> None:
        self.point = point
        self.history = StoreHistory()
        """Every change of the key delivered to this instance, in either role."""
        self.seen: deque[Synced] = deque(maxlen=SEEN_WHILE_STANDBY)
        self.published: PointValue | None = None
        """The publish counted as the store's until the next decision: while standby what
        the active's record names, then what the takeover or the read back made of it."""
        self.own_doubt = False
        """`published` is about our own publish in doubt, not a former active's."""

    def follow_value(self, value: bytes | None, version: Hlc | None) -> None:
        """While standby: a value the store held (the active keeps both sides equal, so it
        is a candidate for what the controller holds)."""
        if value is None or version is None:
            return
        parsed = decisions.parsed(self.point, value)
        if parsed is not None:
            self.seen.append(Synced(parsed, version))

    def follow_entry(self, entry: PointRecord) -> None:
        """While standby: the active's record entry names the publish it counts."""
        self.published = entry.published if entry.published is not None else entry.unanswered

    def take_former_publish(
        self, entry: PointRecord, marked_at: Hlc | None, store: StoreReading
    ) -> bool:
        """At a takeover: the publish the former active's record entry marks (`marked_at`:
        the record's version) is counted as the store's, unless the store never had it.
        False if the entry marks one the store never had (refused)."""
        self._take(entry, marked_at, store, own=False)
        return entry.published is None or self.published is not None

    def take_own_publish(
        self, entry: PointRecord | None, marked_at: Hlc | None, store: StoreReading
    ) -> None:
        """Our publish in doubt, counted as the store's if the record sent behind it,
        read back (None: not in the store), marks it."""
        self._take(entry, marked_at, store, own=True)

    def _take(
        self, entry: PointRecord | None, marked_at: Hlc | None, store: StoreReading, *, own: bool
    ) -> None:
        self.own_doubt = own
        self.published = None
        if entry is not None:
            self.published = self.history.former_publish(
                entry,
                marked_at,
                decisions.parsed(self.point, store.raw),
                store.version,
                store.whole_since,
            )

    def base(
        self,
        own: Synced,
        record: Synced | None,
        pending: Iterable[Synced],
        controller: PointValue,
    ) -> Synced:
        """What the controller was last synced at, for the decision (decisions.takeover_base)."""
        seen = [*self.seen, *pending]
        return decisions.takeover_base(own, record, seen, controller, self.published)

    def decided(self) -> None:
        """The decision was made: nothing of this is needed again."""
        self.seen.clear()
        self.published = None
        self.own_doubt = False
