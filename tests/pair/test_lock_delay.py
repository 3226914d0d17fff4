"""The lock delay rule, exhaustively over sequences of sightings."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.pair.lock_delay import LockDelay

TTL = 3.0


def test_nothing_seen_means_a_full_ttl_from_the_start() -> None:
    delay = LockDelay.starting(TTL, now=100.0)
    assert delay.wait_s(100.0) == TTL
    assert delay.wait_s(102.0) == 1.0
    assert delay.wait_s(104.0) == 0.0


def test_a_live_delete_ends_the_wait_at_once() -> None:
    delay = LockDelay.starting(TTL, now=0.0)
    delay.seen_held(1.0)
    delay.seen_released(2.5)
    assert delay.wait_s(2.5) == 0.0


def test_held_again_after_a_release_waits_again() -> None:
    delay = LockDelay.starting(TTL, now=0.0)
    delay.seen_released(5.0)
    delay.seen_held(6.0)
    assert delay.wait_s(6.0) == TTL


def test_a_link_outage_counts_as_seeing_it_held() -> None:
    delay = LockDelay.starting(TTL, now=0.0)
    delay.seen_released(5.0)
    delay.lost_sight(9.0)
    assert delay.wait_s(9.0) == TTL


events = st.lists(
    st.tuples(st.sampled_from(["held", "released", "lost"]), st.floats(0, 5)), max_size=30
)


@given(events)
def test_never_drives_within_a_ttl_of_a_sighting_not_followed_by_a_release(
    steps: list[tuple[str, float]],
) -> None:
    now = 0.0
    delay = LockDelay.starting(TTL, now)
    last_unreleased: float | None = now
    for kind, gap in steps:
        now += gap
        if kind == "released":
            delay.seen_released(now)
            last_unreleased = None
        else:
            (delay.seen_held if kind == "held" else delay.lost_sight)(now)
            last_unreleased = now
        if last_unreleased is not None:
            # Driving at now + wait is never within a TTL of that sighting.
            assert now + delay.wait_s(now) >= last_unreleased + TTL - 1e-9
        else:
            assert delay.wait_s(now) == 0.0


def test_an_answer_to_a_request_sent_before_a_live_delete_is_no_new_sighting() -> None:
    """The point-to-point soak's 1.95 s without an active: a restarted instance's refused
    NEX (sent while its former process's lease still ran) was handled after the lease's
    live DELETE; counted as a sighting, it made the instance wait out a whole TTL more
    after it took the lock."""
    delay = LockDelay.starting(TTL, now=0.0)
    delay.seen_held(3.0)
    delay.seen_released(3.3)
    delay.seen_held(3.31, asked_at=3.29)  # the refusal, asked before the DELETE came
    assert delay.wait_s(3.32) == 0.0
    delay.seen_held(3.5, asked_at=3.4)  # asked after it: a new holder
    assert delay.wait_s(3.5) == TTL
