"""The one backoff schedule: exponential ceilings, full jitter, a seeded random, reset."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.backoff import Backoff, backoff_ceiling, backoff_delay


class _Highest(random.Random):
    """Always draws the longest delay allowed, and records the intervals drawn from."""

    def __init__(self) -> None:
        super().__init__(0)
        self.intervals: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.intervals.append((a, b))
        return b


def test_ceiling_doubles_from_the_minimum_up_to_the_maximum() -> None:
    rng = _Highest()
    backoff = Backoff(0.5, 30.0, rng=rng)
    assert [next(backoff) for _ in range(9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert all(low == 0.0 for low, _ in rng.intervals)  # full jitter: from zero
    assert backoff.attempts == 9


def test_no_overflow_on_long_outages() -> None:
    assert backoff_ceiling(10_000, 0.5, 30.0) == 30.0
    backoff = Backoff(0.5, 30.0, rng=_Highest())
    for _ in range(2000):
        delay = backoff.next_delay()
    assert delay == 30.0


def test_reset_starts_over_from_the_minimum() -> None:
    backoff = Backoff(1.0, 60.0, rng=_Highest())
    assert [backoff.next_delay() for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]
    backoff.reset()
    assert backoff.attempts == 0
    assert [backoff.next_delay() for _ in range(2)] == [1.0, 2.0]


def test_a_ceiling_caps_one_delay_and_the_schedule_below_it() -> None:
    backoff = Backoff(2.0, 30.0, rng=_Highest())
    assert [backoff.next_delay(ceiling=0.1) for _ in range(3)] == [0.1, 0.1, 0.1]
    # Without it, the schedule goes on where it was.
    assert backoff.next_delay() == 16.0
    assert backoff.next_delay(ceiling=100.0) == 30.0  # never above the maximum


def test_a_seeded_random_replays_the_same_delays() -> None:
    one = Backoff(0.5, 30.0, rng=random.Random(1234))
    two = Backoff(0.5, 30.0, rng=random.Random(1234))
    assert [next(one) for _ in range(12)] == [next(two) for _ in range(12)]


def test_full_jitter_spreads_over_the_whole_interval() -> None:
    rng = random.Random(7)
    spread = [backoff_delay(3, 0.5, 30.0, rng.uniform) for _ in range(2000)]
    assert min(spread) < 0.4 and max(spread) > 3.6  # interval [0, 4]
    assert all(0.0 <= delay <= 4.0 for delay in spread)
    assert len(set(spread)) == len(spread)


@given(
    attempt=st.integers(min_value=0, max_value=10**6),
    minimum=st.floats(min_value=0.001, max_value=10),
    extra=st.floats(min_value=0, max_value=100),
    seed=st.integers(),
)
def test_delays_stay_within_bounds(attempt: int, minimum: float, extra: float, seed: int) -> None:
    maximum = minimum + extra
    delay = backoff_delay(attempt, minimum, maximum, random.Random(seed).uniform)
    assert 0.0 <= delay <= min(maximum, minimum * 2.0 ** min(attempt, 64))


@pytest.mark.parametrize(("minimum", "maximum"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_nonsensical_bounds_are_refused(minimum: float, maximum: float) -> None:
    with pytest.raises(ValueError):
        Backoff(minimum, maximum)


def test_a_negative_attempt_is_refused() -> None:
    with pytest.raises(ValueError):
        backoff_delay(-1, 0.5, 30.0)


async def test_sleep_waits_the_delay_it_returns() -> None:
    backoff = Backoff(0.05, 0.05, rng=_Highest())
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await backoff.sleep() == 0.05
    assert loop.time() - began >= 0.05
