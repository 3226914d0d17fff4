"""When a lease is renewed, from its length and the link's round trip. Pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.pair.renewal import HOLDABLE, LeaseTiming, RoundTrips


def test_a_fast_link_renews_three_times_a_ttl() -> None:
    timing = LeaseTiming(3.0, 0.3, hold_s=0.7)
    assert timing.period_s(0.002) == pytest.approx(1.0, abs=0.01)


def test_a_slow_link_renews_early_enough_for_its_round_trip() -> None:
    # 1.2 s round trip, 40 % of a 3 s TTL: each answer must still find the lease running.
    timing = LeaseTiming(3.0, 0.3, hold_s=0.7)
    period = timing.period_s(1.2)
    assert timing.can_hold(1.2)
    assert period < 1.0
    assert 2 * period + 1.2 + 0.7 <= timing.lease_s + 1e-9  # one renewal may be lost


def test_a_round_trip_too_long_for_the_lease_cannot_hold_one() -> None:
    assert not LeaseTiming(1.0, 0.1).can_hold(1.2)  # 1.2 s against a 1 s TTL
    assert LeaseTiming(1.0, 0.1).can_hold(0.5)


@given(st.floats(0.5, 30), st.floats(0.0, 0.2), st.floats(0.0, 0.9), st.floats(0.0, 0.5))
def test_each_renewal_is_answered_before_the_lease_it_extends_ends(
    ttl_s: float, margin_share: float, trip_share: float, hold_s: float
) -> None:
    timing = LeaseTiming(ttl_s, ttl_s * margin_share, hold_s)
    round_trip = trip_share * timing.lease_s
    period = timing.period_s(round_trip)
    assert ttl_s / 12 - 1e-9 <= period <= ttl_s / 3 + 1e-9
    if timing.can_hold(round_trip) and round_trip + hold_s + 2 * ttl_s / 12 <= timing.lease_s:
        # Renewed every `period`, each answered `round_trip` after its send: the lease still
        # covers the longest transaction when the next answer comes, with one renewal lost.
        assert 2 * period + round_trip <= timing.lease_s - hold_s + 1e-9
    assert timing.can_hold(round_trip) == (round_trip <= HOLDABLE * timing.lease_s)


def test_the_links_round_trip_is_the_longest_recent_one() -> None:
    trips = RoundTrips(kept=3)
    assert trips.worst_s == 0.0
    trips.extend([0.1, 0.9, 0.2])
    assert trips.worst_s == 0.9
    trips.extend([0.1, 0.1, 0.1])  # the slow one has aged out
    assert trips.worst_s == pytest.approx(0.1)
