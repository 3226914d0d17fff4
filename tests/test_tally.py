from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.tally import Tally

BOUNDS = (0.01, 0.1, 1.0)


def test_counts_by_key() -> None:
    tally = Tally()
    tally.count(("t01", "poll", "ok"))
    tally.count(("t01", "poll", "ok"))
    tally.count(("t02", "poll", "timeout"), 3)
    assert dict(tally.items()) == {("t01", "poll", "ok"): 2, ("t02", "poll", "timeout"): 3}


def test_a_duration_on_a_bound_falls_in_its_bucket() -> None:
    """Prometheus's buckets are upper bounds, inclusive (le)."""
    tally = Tally(BOUNDS)
    for took in (0.01, 0.5, 7.0):
        tally.observe(("poll",), took)
    (key, durations), *_ = tally.histograms()
    assert key == ("poll",) and durations.cumulative() == [1, 1, 2, 3]
    assert durations.count == 3 and durations.total_s == 7.51


@given(st.lists(st.floats(min_value=0, max_value=100, allow_nan=False)))
def test_the_cumulative_buckets_count_every_duration_at_or_below_each_bound(
    durations_s: list[float],
) -> None:
    tally = Tally(BOUNDS)
    for took in durations_s:
        tally.observe(("x",), took)
    histograms = dict(tally.histograms())
    if not durations_s:
        assert histograms == {}
        return
    cumulative = histograms[("x",)].cumulative()
    for bound, below in zip((*BOUNDS, float("inf")), cumulative, strict=True):
        assert below == sum(took <= bound for took in durations_s)
