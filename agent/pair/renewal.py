"""When to renew a lease, from its length and the round trip the link has shown. Pure.

A renewal extends the lease from its send time, but only once its answer is back; so the
lease holds as long as each renewal's answer arrives before the deadline the previous one
set. With a lease of L seconds (the TTL less the safety margin), a round trip of R and a
renewal every P seconds, the answer to a renewal comes R after it is sent, when the lease
has L - P - R left, and that must still cover the longest transaction on the line (H,
which the line's gate asks for before its first byte). So

    P = (L - R - H) / 2     (room for one lost renewal),

never more than a third of the TTL (the steady rate) and never less than a twelfth (the
most a lease may cost the store). A link whose round trip takes most of the lease cannot
hold one at all: with R > HOLDABLE x L a holder would lose its lease again and again, and
the line would have no active in the meantime, so such an instance does not contend and
says why instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

RENEWALS_PER_TTL = 3
"""The slowest renewal rate: three times a TTL, so that one lost or late renewal costs
nothing."""
MOST_RENEWALS_PER_TTL = 12
HOLDABLE = 0.8
"""The largest round trip, as a share of the lease, that can hold one."""
ROUND_TRIPS_KEPT = 8


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    ttl_s: float
    margin_s: float
    hold_s: float = 0.0
    """The longest transaction on the line: what a lease must still cover."""

    def __post_init__(self) -> None:
        if not 0 <= self.margin_s < self.ttl_s or self.hold_s < 0:
            raise ValueError("need 0 <= margin < ttl and a hold time >= 0")

    @property
    def lease_s(self) -> float:
        """How long a lease lasts locally, from the send time of its acquire or renewal."""
        return self.ttl_s - self.margin_s

    def period_s(self, round_trip_s: float) -> float:
        """How long after one renewal's send the next is sent."""
        room = (self.lease_s - round_trip_s - self.hold_s) / 2
        slowest = self.ttl_s / RENEWALS_PER_TTL
        fastest = self.ttl_s / MOST_RENEWALS_PER_TTL
        return min(slowest, max(fastest, room))

    def can_hold(self, round_trip_s: float) -> bool:
        """Whether a link with this round trip can hold a lease at all."""
        return round_trip_s <= HOLDABLE * self.lease_s


class RoundTrips:
    """The last few round trips to the store; the link's is the longest of them."""

    def __init__(self, kept: int = ROUND_TRIPS_KEPT) -> None:
        self._seen: deque[float] = deque(maxlen=kept)

    def add(self, seconds: float) -> None:
        if seconds >= 0:
            self._seen.append(seconds)

    def extend(self, seconds: Iterable[float]) -> None:
        for value in seconds:
            self.add(value)

    @property
    def worst_s(self) -> float:
        """The longest recent round trip (0 before any)."""
        return max(self._seen, default=0.0)

    def __len__(self) -> int:
        return len(self._seen)
