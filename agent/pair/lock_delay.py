"""When another holder's lease has provably ended: the lock delay. Pure, no I/O.

Acquiring the lock is not enough to drive the line. A store that restarted without its
contents (the emulator keeps them in memory) hands the lock out again while the former
holder may still be inside its own lease, driving; so may a holder whose renewals we could
not see while our link was down. A new holder drives only once the previous lease has
provably ended:

- it saw the lock's DELETE live (released, or expired at the store: either way the holder
  stopped before that, by its own deadline or before releasing); or
- a full TTL has passed since it last saw the lock held by someone else.

What was not seen counts as held: at start, and while the link was down, anything may have
happened at the store, so those moments count as sightings too. (Consul calls this rule a
lock delay.) Times are monotonic seconds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LockDelay:
    ttl_s: float
    _ended_by: float = 0.0
    _released_at: float = float("-inf")
    _held_seen_at: float = float("-inf")

    @classmethod
    def starting(cls, ttl_s: float, now: float) -> LockDelay:
        """Nothing seen yet: a lease of another holder may have just been renewed."""
        delay = cls(ttl_s)
        delay.seen_held(now)
        return delay

    def seen_held(self, now: float, *, asked_at: float | None = None) -> None:
        """Another holder held the lock at `now` (a notification, a GET, a refused NEX).

        `asked_at`: when the request whose answer showed it was sent. An answer to a request
        sent before a live DELETE this instance has seen since shows the lease that DELETE
        ended (the answer was merely handled later): it is not counted. A holder that took
        the lock after that DELETE is seen all the same: the store sends its SET's
        notification before it answers a request it handles later."""
        if asked_at is not None and asked_at < self._released_at:
            return
        self._ended_by = max(self._ended_by, now + self.ttl_s)
        self._held_seen_at = max(self._held_seen_at, now)

    def seen_held_since(self, moment: float) -> bool:
        """Whether another holder (or a moment not seen) was counted after `moment`."""
        return self._held_seen_at > moment

    def seen_released(self, now: float) -> None:
        """A live DELETE notification of the lock: the previous lease is over."""
        self._ended_by = min(self._ended_by, now)
        self._released_at = now

    def lost_sight(self, now: float) -> None:
        """The link to the store was down until `now`: what happened meanwhile is unknown."""
        self.seen_held(now)

    def wait_s(self, now: float) -> float:
        """How long a new holder must still wait before it drives the line."""
        return max(0.0, self._ended_by - now)
