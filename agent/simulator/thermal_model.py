"""A first-order thermal model for the fake controllers.

Pure: time is passed in. The temperature approaches the set point exponentially with a
time constant; the output is proportional to the remaining error and the mode follows
its sign, with a deadband in which the controller idles.
"""

from __future__ import annotations

import math

from agent.controller.interface import ControllerState, Mode


class ThermalModel:
    def __init__(
        self,
        *,
        setpoint: float,
        temperature: float,
        now: float,
        time_constant_s: float = 60.0,
        deadband: float = 0.2,
        gain_percent_per_degree: float = 25.0,
    ) -> None:
        if not time_constant_s >= 0:
            raise ValueError(f"time constant must be >= 0, not {time_constant_s}")
        if not deadband >= 0:
            raise ValueError(f"deadband must be >= 0, not {deadband}")
        if not gain_percent_per_degree > 0:
            raise ValueError(f"gain must be > 0, not {gain_percent_per_degree}")
        self.setpoint = setpoint
        self.temperature = temperature
        self.time_constant_s = time_constant_s
        self.deadband = deadband
        self.gain = gain_percent_per_degree
        self.updated_at = now

    def advance(self, now: float) -> None:
        """Move the temperature on to time `now` (a time in the past changes nothing)."""
        elapsed = now - self.updated_at
        if elapsed <= 0:
            return
        if self.time_constant_s == 0:
            self.temperature = self.setpoint
        else:
            remaining = math.exp(-elapsed / self.time_constant_s)
            self.temperature = self.setpoint + (self.temperature - self.setpoint) * remaining
        self.updated_at = now

    def set_setpoint(self, value: float, now: float) -> None:
        # The temperature moved toward the old set point until now.
        self.advance(now)
        self.setpoint = value

    @property
    def error(self) -> float:
        return self.setpoint - self.temperature

    @property
    def mode(self) -> Mode:
        if self.error > self.deadband:
            return Mode.HEAT
        if self.error < -self.deadband:
            return Mode.COOL
        return Mode.IDLE

    @property
    def output(self) -> int:
        """Percent, 0..100; 0 while idle."""
        if self.mode is Mode.IDLE:
            return 0
        return min(100, max(0, round(abs(self.error) * self.gain)))

    def state(self, now: float) -> ControllerState:
        self.advance(now)
        return ControllerState(
            setpoint=self.setpoint,
            temperature=self.temperature,
            output=self.output,
            mode=self.mode,
        )
