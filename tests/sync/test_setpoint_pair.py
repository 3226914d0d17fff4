"""The order a heating and a cooling set point changed together go to the unit in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.controller.points import check_deadband
from agent.sync.setpoint_pair import COOL, HEAT, first_to_write

halves = st.integers(10, 70).map(lambda n: n / 2)
deadbands = st.sampled_from([0.5, 1.0, 2.0])


@st.composite
def two_pairs(draw: st.DrawFn) -> tuple[float, float, float, float, float]:
    """A deadband, and the unit's heating and cooling set points before and after, each
    pair keeping it (drawn so, not filtered: most random pairs would not)."""
    least = draw(deadbands)

    def kept() -> tuple[float, float]:
        heat = draw(halves)
        return heat, heat + least + draw(st.integers(0, 20)) / 2

    (heat0, cool0), (heat, cool) = kept(), kept()
    return heat0, cool0, heat, cool, least


@given(two_pairs())
def test_the_unit_keeps_the_deadband_after_each_write(
    pairs: tuple[float, float, float, float, float],
) -> None:
    heat0, cool0, heat, cool, least = pairs
    assert check_deadband(heat0, cool0, least) is None
    assert check_deadband(heat, cool, least) is None
    first = first_to_write(heat0, cool, least)
    between = (heat0, cool) if first == COOL else (heat, cool0)
    assert check_deadband(*between, least) is None, (first, between)


def test_raising_writes_cool_first_and_lowering_heat_first() -> None:
    assert first_to_write(20.0, 27.0, 1.0) == COOL
    assert first_to_write(20.0, 19.5, 1.0) == HEAT
    assert first_to_write(None, 19.5, 1.0) == COOL  # nothing read: as it comes
