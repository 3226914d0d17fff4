"""What this instance saw of a point's key in the store: every change delivered to it, in
either role, newest last, and how far back that sight is whole.

A takeover asks it whether the publish that the former active's record marks ever reached
the store. The record alone cannot tell a publish the store took, followed by a remote
change, from one the store refused (a remote writer fenced with the version of a renewal
the active had not heard of yet), followed by the same remote change: the store keeps no
history. This instance, watching the key all along, saw the one or the other."""

from __future__ import annotations

from collections import deque

from agent.controller.interface import PointValue
from agent.protocol.hlc import Hlc
from agent.sync.decisions import Synced, published_marker, same
from agent.sync.record import PointRecord

KEPT = 64
"""Changes kept per point: minutes of them under the heaviest load a line sees."""


class StoreHistory:
    def __init__(self, kept: int = KEPT) -> None:
        self._values: deque[Synced] = deque(maxlen=kept)
        self._floor: Hlc | None = None
        """The newest version dropped to keep the bound: nothing older is known."""

    def saw(self, value: PointValue | None, version: Hlc | None) -> None:
        """A change of the key, as delivered (a value that does not parse as None)."""
        if version is None:
            return
        if len(self._values) == self._values.maxlen:
            dropped = self._values[0].version
            if dropped is not None and (self._floor is None or dropped > self._floor):
                self._floor = dropped
        self._values.append(Synced(value, version))

    def values(self) -> tuple[Synced, ...]:
        """The changes kept, oldest first."""
        return tuple(self._values)

    def reached_store(
        self,
        published: PointValue,
        after: Hlc | None,
        before: Hlc | None,
        whole_since: Hlc | None,
    ) -> bool | None:
        """Whether the store took `published` with a version between `after` and `before`
        (the token it was sent with, and the record sent behind it): True when it was seen
        so; False when it was not, and every change of the key since `whole_since` (the
        client's `delivered_since`) was seen and kept, from no later than `after` or from
        no later than the last change seen before the record (the key held another value
        when the record was written); None when that cannot be said.

        The second kind of sight is what an instance has that caught up after a reconnect
        between the publish and now: its own publish unanswered, the connection lost, it
        read the key again and has watched it since. A publish taken, then another change
        landing between it and the record (the two sent at once on one connection), looks
        the same as a refusal: the same race `decisions.published_marker` accepts."""
        if after is None or before is None:
            return None
        newest_before: Hlc | None = None  # of the changes seen before the record
        for seen in self._values:
            version = seen.version
            if version is None or version >= before:
                continue
            if after < version and same(seen.value, published):
                return True
            if newest_before is None or version > newest_before:
                newest_before = version
        if whole_since is None:
            return None
        if self._floor is not None and self._floor > whole_since:
            whole_since = self._floor
        if whole_since <= after:
            return False
        # Seen whole since no later than the last change before the record: the key held
        # that change's value, not the published one, when the record was written.
        if newest_before is not None and newest_before >= whole_since:
            return False
        return None

    def former_publish(
        self,
        entry: PointRecord,
        marked_at: Hlc | None,
        store_value: PointValue | None,
        store_version: Hlc | None,
        whole_since: Hlc | None,
    ) -> PointValue | None:
        """What a takeover counts as the former active's last publish, by its record's
        entry for the point (`marked_at`: the record's version): the marked one, unless it
        never reached the store (`decisions.published_marker`, with what this instance saw);
        else one whose answer never came (the store may have it)."""
        published = None
        if entry.published is not None:
            reached = self.reached_store(
                entry.published, entry.published_after, marked_at, whole_since
            )
            published = published_marker(
                entry.published, marked_at, store_value, store_version, reached
            )
        return entry.unanswered if published is None else published
