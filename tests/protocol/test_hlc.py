from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.protocol.hlc import (
    MAX_COUNTER,
    ClockDrift,
    Hlc,
    HybridLogicalClock,
    MalformedTimestamp,
)


class FakeWall:
    def __init__(self, now: int = 1_696_374_425_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_parse_is_lenient_about_any_number_of_leading_zeros() -> None:
    assert Hlc.parse("0" * 5000 + "5:" + "0" * 5000 + "7:n") == Hlc(5, 7, "n")


def test_format_is_zero_padded() -> None:
    assert str(Hlc(1_696_374_425_000, 0, "CLIENT")) == "001696374425000:00000:CLIENT"
    assert str(Hlc(5, 42, "n")) == "000000000000005:00042:n"


def test_parse_example_and_lenient_padding() -> None:
    assert Hlc.parse("001696374425000:00000:CLIENT") == Hlc(1_696_374_425_000, 0, "CLIENT")
    assert Hlc.parse("1696374425000:7:CLIENT") == Hlc(1_696_374_425_000, 7, "CLIENT")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1:2",
        "1:2:3:4",
        "a:0:n",
        "1:b:n",
        "-1:0:n",
        "1:-1:n",
        "+1:0:n",
        " 1:0:n",
        "1_000:0:n",
        "1.5:0:n",
        ":0:n",
        "1::n",
        "1000000000000000:0:n",
        f"1:{MAX_COUNTER + 1}:n",
        "١٢:0:n",  # non-ASCII digits
        "9" * 5000 + ":0:n",  # past Python's int() digit limit: found by fuzzing
        "1:" + "9" * 5000 + ":n",
    ],
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(MalformedTimestamp):
        Hlc.parse(text)


@given(
    st.integers(0, 999_999_999_999_999),
    st.integers(0, MAX_COUNTER),
    st.text(st.characters(blacklist_characters=":"), max_size=20),
)
def test_format_parse_round_trip(wall: int, counter: int, node: str) -> None:
    ts = Hlc(wall, counter, node)
    assert Hlc.parse(str(ts)) == ts


def test_total_order_wall_then_counter_then_node_bytes() -> None:
    a = Hlc(1, 5, "z")
    b = Hlc(2, 0, "a")
    c = Hlc(2, 1, "a")
    d = Hlc(2, 1, "b")
    assert a < b < c < d
    assert sorted([d, c, b, a]) == [a, b, c, d]
    # Byte-wise: upper case sorts before lower case.
    assert Hlc(1, 1, "Z") < Hlc(1, 1, "a")


@given(st.text(min_size=1, max_size=3), st.text(min_size=1, max_size=3))
def test_node_order_is_bytewise(x: str, y: str) -> None:
    x, y = x.replace(":", ""), y.replace(":", "")
    assert (Hlc(1, 1, x) < Hlc(1, 1, y)) == (x.encode() < y.encode())


def test_tick_takes_wall_clock_when_ahead_else_counts() -> None:
    wall = FakeWall(1000)
    clock = HybridLogicalClock("me", wall)
    assert clock.tick() == Hlc(1000, 0, "me")
    assert clock.tick() == Hlc(1000, 1, "me")
    wall.now = 1001
    assert clock.tick() == Hlc(1001, 0, "me")


def test_tick_is_monotonic_when_the_wall_clock_steps_back() -> None:
    wall = FakeWall(10_000)
    clock = HybridLogicalClock("me", wall)
    first = clock.tick()
    wall.now = 9_000
    assert clock.tick() > first


def test_receive_takes_the_maximum() -> None:
    wall = FakeWall(1000)
    clock = HybridLogicalClock("me", wall)
    clock.tick()
    assert clock.receive(Hlc(5000, 3, "other")) == Hlc(5000, 4, "me")
    assert clock.receive(Hlc(5000, 9, "other")) == Hlc(5000, 10, "me")
    assert clock.receive(Hlc(10, 9, "other")) == Hlc(5000, 11, "me")
    wall.now = 6000
    assert clock.receive(Hlc(10, 9, "other")) == Hlc(6000, 0, "me")


def test_receive_ignores_own_node() -> None:
    clock = HybridLogicalClock("me", FakeWall(1000))
    before = clock.tick()
    assert clock.receive(Hlc(9_999_999, 0, "me")) == before


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2000), st.integers(0, 50)), max_size=50))
def test_clock_never_goes_back(events: list[tuple[bool, int, int]]) -> None:
    wall = FakeWall(1000)
    clock = HybridLogicalClock("me", wall, max_drift_ms=10**9)
    last = clock.current
    for is_receive, when, counter in events:
        wall.now = when
        nxt = clock.receive(Hlc(when + 100, counter, "peer")) if is_receive else clock.tick()
        assert nxt > last
        last = nxt


def test_counter_overflow_moves_the_wall_part_on() -> None:
    clock = HybridLogicalClock("me", FakeWall(1000))
    clock.receive(Hlc(1000, MAX_COUNTER - 1, "peer"))
    assert clock.current == Hlc(1000, MAX_COUNTER, "me")
    assert clock.tick() == Hlc(1001, 0, "me")
    assert clock.tick() == Hlc(1001, 1, "me")


def test_receive_of_a_full_counter_moves_the_wall_part_on() -> None:
    clock = HybridLogicalClock("me", FakeWall(1000))
    assert clock.receive(Hlc(1000, MAX_COUNTER, "peer")) == Hlc(1001, 0, "me")
    clock = HybridLogicalClock("me", FakeWall(1000))
    clock.receive(Hlc(5000, MAX_COUNTER - 1, "peer"))
    assert clock.receive(Hlc(10, 0, "peer")) == Hlc(5001, 0, "me")  # own counter full
    clock = HybridLogicalClock("me", FakeWall(1000))
    clock.receive(Hlc(5000, 3, "peer"))
    assert clock.receive(Hlc(5000, MAX_COUNTER, "peer")) == Hlc(5001, 0, "me")  # both


def test_a_timestamp_59_s_ahead_with_a_full_counter_never_stops_the_clock() -> None:
    """The timestamp that once wedged the service for a minute (every tick raised)."""
    wall = FakeWall(100_000)
    clock = HybridLogicalClock("me", wall)
    clock.receive(Hlc(159_000, 99_998, "hostile"))
    stamps = [clock.tick() for _ in range(250_000)]
    assert all(a < b for a, b in itertools.pairwise(stamps))
    assert all(s.counter <= MAX_COUNTER for s in stamps)
    assert stamps[-1] == Hlc(159_003, 49_999, "me")
    assert all(Hlc.parse(str(s)) == s for s in stamps[::1000])


@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.integers(0, 2000),
            st.sampled_from([0, 1, MAX_COUNTER - 2, MAX_COUNTER - 1, MAX_COUNTER]),
        ),
        max_size=60,
    ),
    st.integers(0, MAX_COUNTER),
)
def test_clock_never_goes_back_nor_overflows(
    events: list[tuple[bool, int, int]], start_counter: int
) -> None:
    wall = FakeWall(1000)
    clock = HybridLogicalClock("me", wall, max_drift_ms=10**9)
    clock.receive(Hlc(1000, start_counter, "peer"))
    last = clock.current
    for is_receive, when, counter in events:
        wall.now = when
        nxt = clock.receive(Hlc(when, counter, "peer")) if is_receive else clock.tick()
        assert nxt > last
        assert 0 <= nxt.counter <= MAX_COUNTER
        assert Hlc.parse(str(nxt)) == nxt
        last = nxt


def test_skew_check_refuses_a_clock_too_far_ahead() -> None:
    wall = FakeWall(100_000)
    clock = HybridLogicalClock("me", wall)
    clock.receive(Hlc(160_000, 0, "peer"))  # 60 s ahead: still fine
    clock.check_usable()
    clock.receive(Hlc(160_001, 0, "peer"))
    with pytest.raises(ClockDrift):
        clock.check_usable()
    wall.now = 100_100  # the wall clock catches up
    clock.check_usable()
    assert clock.tick() > Hlc(160_001, 0, "peer")


def test_node_id_cannot_hold_a_colon() -> None:
    with pytest.raises(ValueError):
        HybridLogicalClock("a:b", FakeWall())
