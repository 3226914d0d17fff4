"""Hybrid logical clock (protocol.md §4).

Text form `{wall_ms:015}:{counter:05}:{node_id}`. The clock is pure: the wall clock is a
function passed in, so tests and the emulator control time.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# The service rejects timestamps more than this far ahead of its own clock.
MAX_CLOCK_DRIFT_MS = 60_000
# Keeps the formatted counter five digits wide, so that the fixed-width text still sorts.
MAX_COUNTER = 99_999
# Fifteen digits of milliseconds.
MAX_WALL_MS = 999_999_999_999_999

_DIGITS = re.compile(r"[0-9]+")
_WALL_DIGITS = len(str(MAX_WALL_MS))
_COUNTER_DIGITS = len(str(MAX_COUNTER))

WallClock = Callable[[], int]
"""Returns the wall clock in milliseconds since the epoch."""


class HlcError(ValueError):
    """Base of the clock's errors."""


class MalformedTimestamp(HlcError):
    """The text is not a hybrid logical clock."""


class ClockDrift(HlcError):
    """A timestamp is too far ahead of the local wall clock."""


@dataclass(frozen=True, slots=True)
class Hlc:
    wall_ms: int
    counter: int
    node_id: str

    @classmethod
    def parse(cls, text: str) -> Hlc:
        parts = text.split(":")
        if len(parts) != 3:
            raise MalformedTimestamp(f"expected three ':'-separated parts: {text[:64]!r}")
        wall, counter, node_id = parts
        if not _DIGITS.fullmatch(wall) or not _DIGITS.fullmatch(counter):
            raise MalformedTimestamp(f"wall clock and counter must be decimal: {text[:64]!r}")
        # Leading zeros are padding; past them, too many digits are out of range before
        # int() sees them (it refuses thousands of digits with a plain ValueError).
        wall_digits, counter_digits = wall.lstrip("0"), counter.lstrip("0")
        if len(wall_digits) > _WALL_DIGITS or len(counter_digits) > _COUNTER_DIGITS:
            raise MalformedTimestamp(f"out of range: {text[:64]!r}")
        wall_ms, count = int(wall_digits or "0"), int(counter_digits or "0")
        if wall_ms > MAX_WALL_MS or count > MAX_COUNTER:
            raise MalformedTimestamp(f"out of range: {text[:64]!r}")
        return cls(wall_ms, count, node_id)

    def __str__(self) -> str:
        return f"{self.wall_ms:015d}:{self.counter:05d}:{self.node_id}"

    def _key(self) -> tuple[int, int, bytes]:
        return (self.wall_ms, self.counter, self.node_id.encode())

    def __lt__(self, other: Hlc) -> bool:
        return self._key() < other._key()

    def __le__(self, other: Hlc) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: Hlc) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: Hlc) -> bool:
        return self._key() >= other._key()

    def drift_ms(self, now_ms: int) -> int:
        """How far this timestamp is ahead of `now_ms` (negative when behind)."""
        return self.wall_ms - now_ms


def check_drift(ts: Hlc, now_ms: int, max_drift_ms: int = MAX_CLOCK_DRIFT_MS) -> None:
    if ts.drift_ms(now_ms) > max_drift_ms:
        raise ClockDrift(f"{ts} is {ts.drift_ms(now_ms)} ms ahead of the wall clock")


def _after(wall_ms: int, counter: int, node_id: str) -> Hlc:
    """The smallest timestamp of `node_id` after (wall_ms, counter).

    A full counter moves the wall part on by one millisecond instead of stopping the clock:
    a peer's timestamp with a counter near MAX_COUNTER (well-formed, so accepted) must not
    leave this node unable to stamp anything until its wall clock catches up.
    """
    if counter >= MAX_COUNTER:
        return Hlc(wall_ms + 1, 0, node_id)
    return Hlc(wall_ms, counter + 1, node_id)


class HybridLogicalClock:
    """A node's clock: `tick()` before sending, `receive()` on every timestamp seen."""

    def __init__(
        self, node_id: str, wall_clock: WallClock, max_drift_ms: int = MAX_CLOCK_DRIFT_MS
    ) -> None:
        if ":" in node_id:
            raise ValueError(f"a node id cannot contain ':': {node_id!r}")
        self.node_id = node_id
        self._wall_clock = wall_clock
        self.max_drift_ms = max_drift_ms
        self._last = Hlc(0, 0, node_id)

    @property
    def current(self) -> Hlc:
        return self._last

    def tick(self) -> Hlc:
        """Send rule: the wall clock if it is ahead, else the next counter.

        No drift check: the service's own clock must keep ticking whatever the wall clock
        does. Clients call check_usable() first.
        """
        now = self._wall_clock()
        last = self._last
        if now > last.wall_ms:
            nxt = Hlc(now, 0, self.node_id)
        else:
            nxt = _after(last.wall_ms, last.counter, self.node_id)
        self._last = nxt
        return nxt

    def receive(self, remote: Hlc) -> Hlc:
        """Receive rule: max of wall clock, own and remote, counter bumped to stay ahead."""
        if remote.node_id == self.node_id:
            return self._last
        # No drift check here: the merge itself is always sound; tick() and check_usable()
        # refuse to stamp anything once the clock has run too far ahead.
        now = self._wall_clock()
        own = self._last
        wall = max(now, own.wall_ms, remote.wall_ms)
        if wall == own.wall_ms and wall == remote.wall_ms:
            nxt = _after(wall, max(own.counter, remote.counter), self.node_id)
        elif wall == own.wall_ms:
            nxt = _after(wall, own.counter, self.node_id)
        elif wall == remote.wall_ms:
            nxt = _after(wall, remote.counter, self.node_id)
        else:
            nxt = Hlc(wall, 0, self.node_id)
        self._last = nxt
        return nxt

    def check_usable(self) -> None:
        """Raises ClockDrift when the clock has run ahead of the wall clock by too much.

        That happens after the wall clock stepped back, or after merging a peer's clock that
        was far ahead; requests stamped now would be refused by the service anyway.
        """
        check_drift(self._last, self._wall_clock(), self.max_drift_ms)
