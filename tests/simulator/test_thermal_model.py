from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.controller.interface import Mode
from agent.simulator.thermal_model import ThermalModel


def test_temperature_approaches_the_setpoint_with_the_time_constant() -> None:
    model = ThermalModel(setpoint=20.0, temperature=10.0, now=0.0, time_constant_s=60.0)
    model.advance(60.0)
    # After one time constant, 1/e of the error is left.
    assert model.temperature == pytest.approx(20.0 - 10.0 / math.e)
    model.advance(600.0)
    assert model.temperature == pytest.approx(20.0, abs=1e-3)


def test_time_going_backwards_changes_nothing() -> None:
    model = ThermalModel(setpoint=20.0, temperature=10.0, now=100.0)
    model.advance(50.0)
    assert model.temperature == 10.0
    assert model.updated_at == 100.0


def test_zero_time_constant_is_instant() -> None:
    model = ThermalModel(setpoint=20.0, temperature=10.0, now=0.0, time_constant_s=0.0)
    model.advance(0.001)
    assert model.temperature == 20.0


def test_setpoint_change_applies_from_its_time() -> None:
    model = ThermalModel(setpoint=20.0, temperature=20.0, now=0.0, time_constant_s=10.0)
    model.set_setpoint(30.0, now=100.0)
    assert model.temperature == 20.0  # it sat at 20 until the change
    model.advance(110.0)
    assert model.temperature == pytest.approx(30.0 - 10.0 / math.e)


@pytest.mark.parametrize(
    ("setpoint", "temperature", "mode", "output"),
    [
        (22.0, 18.0, Mode.HEAT, 100),
        (20.0, 19.0, Mode.HEAT, 25),
        (20.0, 21.0, Mode.COOL, 25),
        (20.0, 20.1, Mode.IDLE, 0),
        (20.0, 19.9, Mode.IDLE, 0),
        (20.0, 30.0, Mode.COOL, 100),
    ],
)
def test_output_and_mode_follow_the_error(
    setpoint: float, temperature: float, mode: Mode, output: int
) -> None:
    model = ThermalModel(setpoint=setpoint, temperature=temperature, now=0.0)
    state = model.state(0.0)
    assert (state.mode, state.output) == (mode, output)


@pytest.mark.parametrize(
    "kwargs",
    [{"time_constant_s": -1.0}, {"deadband": -0.1}, {"gain_percent_per_degree": 0.0}],
)
def test_nonsense_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ThermalModel(setpoint=20.0, temperature=20.0, now=0.0, **kwargs)


@given(
    st.floats(-20, 50),
    st.floats(-20, 50),
    st.lists(st.floats(0, 1000), max_size=10),
    st.floats(0.1, 600),
)
def test_temperature_never_overshoots(
    setpoint: float, temperature: float, steps: list[float], tau: float
) -> None:
    model = ThermalModel(setpoint=setpoint, temperature=temperature, now=0.0, time_constant_s=tau)
    error = abs(setpoint - temperature)
    now = 0.0
    for step in steps:
        now += step
        state = model.state(now)
        new_error = abs(state.setpoint - state.temperature)
        assert new_error <= error + 1e-9
        assert 0 <= (state.output or 0) <= 100
        error = new_error
