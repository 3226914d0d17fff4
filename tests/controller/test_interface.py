from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.controller.interface import (
    DEFAULT_LIMITS,
    ControllerError,
    ControllerFault,
    ControllerUnavailable,
    InvalidSetpoint,
    Limits,
    round_to_step,
    validate_setpoint,
)


def test_default_limits_are_the_contracts() -> None:
    assert Limits(5.0, 35.0, 0.5) == DEFAULT_LIMITS


def test_exceptions_are_distinct_faults() -> None:
    assert issubclass(ControllerUnavailable, ControllerFault)
    assert issubclass(ControllerError, ControllerFault)
    assert not issubclass(ControllerUnavailable, ControllerError)
    assert issubclass(InvalidSetpoint, ValueError)
    assert not issubclass(InvalidSetpoint, ControllerFault)


@pytest.mark.parametrize(
    ("low", "high", "step"),
    [(10, 5, 0.5), (5, 35, 0), (5, 35, -1), (math.nan, 35, 0.5), (5, math.inf, 0.5)],
)
def test_limits_reject_nonsense(low: float, high: float, step: float) -> None:
    with pytest.raises(ValueError):
        Limits(low, high, step)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (21.5, 21.5),
        (21.26, 21.5),
        (21.25, 21.5),  # halves go up
        (21.24, 21.0),
        (5, 5.0),
        (35, 35.0),
        (Decimal("22.7"), 22.5),
        (Fraction(45, 2), 22.5),
    ],
)
def test_valid_setpoints_are_rounded_to_the_step(value: object, expected: float) -> None:
    assert validate_setpoint(value, DEFAULT_LIMITS) == expected


@pytest.mark.parametrize(
    "value",
    [
        4.9,
        35.01,
        -273.0,
        math.nan,
        math.inf,
        -math.inf,
        Decimal("NaN"),
        Decimal("Infinity"),
        10**400,
        "21.5",
        None,
        True,
        [21.5],
        b"21",
    ],
)
def test_invalid_setpoints_raise_a_clear_error(value: object) -> None:
    with pytest.raises(InvalidSetpoint) as caught:
        validate_setpoint(value, DEFAULT_LIMITS)
    assert repr(value)[:20] in str(caught.value)
    assert caught.value.value is value


def test_round_to_step_with_max_off_the_grid() -> None:
    limits = Limits(5.0, 30.2, 0.5)
    assert round_to_step(30.2, limits) == 30.0
    assert round_to_step(30.0, limits) == 30.0


def test_round_to_step_decimal_steps_have_no_binary_noise() -> None:
    limits = Limits(0.0, 10.0, 0.1)
    assert round_to_step(0.3, limits) == 0.3
    assert round_to_step(2.15, limits) == 2.2  # half up, as written, not as stored in binary


limits_strategy = st.builds(
    # Limits as configured: decimal numbers (low + span in binary can land a hair off the
    # grid, e.g. -10.3 + 0.1 == -10.200000000000001, which is not a configured limit).
    lambda low, span, step: Limits(low, round(low + span, 6), step),
    st.integers(-400, 400).map(lambda n: n / 10),
    st.integers(0, 600).map(lambda n: n / 10),
    st.sampled_from([0.1, 0.2, 0.25, 0.5, 1.0, 2.0]),
)


@given(limits_strategy, st.data())
def test_rounding_stays_within_limits_on_the_grid_and_near(
    limits: Limits, data: st.DataObject
) -> None:
    value = data.draw(st.floats(limits.min, limits.max, allow_nan=False))
    result = validate_setpoint(value, limits)
    assert limits.min <= result <= limits.max
    steps = (result - limits.min) / limits.step
    assert abs(steps - round(steps)) < 1e-6
    # Nearest grid point, unless clamped at an off-grid max.
    assert abs(result - value) <= limits.step / 2 + 1e-9 or result + limits.step > limits.max
    assert validate_setpoint(result, limits) == result  # idempotent


@given(limits_strategy, st.floats(allow_nan=True, allow_infinity=True))
def test_anything_outside_or_not_finite_is_rejected(limits: Limits, value: float) -> None:
    if math.isfinite(value) and limits.min <= value <= limits.max:
        assert limits.min <= validate_setpoint(value, limits) <= limits.max
    else:
        with pytest.raises(InvalidSetpoint):
            validate_setpoint(value, limits)
