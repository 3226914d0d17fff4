"""One unit on the fake line: its core (set point, points, thermal model, writes and panel
changes), its faults, and its turnaround; the line (`line.FakeLine`) it is on is told of
every change."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from agent.controller import line_protocol as lp
from agent.controller.interface import ControllerState, PointValue
from agent.controller.sim_profile import SIM_LINE
from agent.simulator.core import DeviceCore, Faults, WriteRecord
from agent.simulator.rtu import RegisterView

log = logging.getLogger("agent.simulator.line")

DEFAULT_TURNAROUND_S = 0.003
"""How long a unit takes before it answers, with line time emulated: a few milliseconds."""


class Notified(Protocol):
    """What a unit needs of its line: to tell it of a change."""

    def notify(self) -> None: ...


class Unit:
    """One device on the line: its core (set point, thermal model, writes), its faults."""

    def __init__(self, line: Notified, address: int | None, core: DeviceCore) -> None:
        self.line = line
        self.address = address
        self.core = core
        self.faults = Faults()
        self.registers: RegisterView | None = None
        """Its Modbus registers, on a Modbus line."""
        self.turnaround_s = DEFAULT_TURNAROUND_S
        """How long it takes before it answers, with line time emulated."""
        self.plug_count = 0
        """How often the unit came back after FAULT UNPLUG."""
        self.reset_count = 0
        """How often it went back to its factory values (FAULT RESET, POWERCYCLE)."""
        self._replug: asyncio.TimerHandle | None = None
        self._reset_at_plug = False

    def __repr__(self) -> str:
        return f"<Unit {self.address} sp={self.setpoint}>"

    @property
    def setpoint(self) -> float:
        return self.core.model.setpoint

    @property
    def writes(self) -> list[WriteRecord]:
        return self.core.writes

    @property
    def panel_changes(self) -> list[WriteRecord]:
        return self.core.panel_changes

    @property
    def unplugged(self) -> bool:
        return self.faults.unplugged_until is not None

    def state(self) -> ControllerState:
        return self.core.state(time.monotonic())

    def panel_setpoint(self, value: float) -> lp.Reply:
        """A person sets the set point at the device."""
        reply = self.core.store_setpoint(value, time.monotonic(), "panel")
        self.line.notify()
        return reply

    def point(self, name: str) -> PointValue:
        """A point's value now (agent.controller.points' names)."""
        return self.core.point_values(time.monotonic())[name]

    def panel_point(self, name: str, value: PointValue) -> lp.Reply:
        """A person changes a point at the device: `panel_point("mode", "cool")`."""
        if name == "setPoint":
            assert isinstance(value, int | float) and not isinstance(value, bool)
            return self.panel_setpoint(float(value))
        return self.panel_value(name, SIM_LINE.encode(name, value))

    def panel_value(self, name: str, text: str) -> lp.Reply:
        """`PANEL <name> <text>` for the point `name` (its text as on the panel)."""
        reply = self.core.set_value(name, text, time.monotonic(), "panel")
        self.line.notify()
        return reply

    def fault(self, kind: str, amount: float = 0.0) -> None:
        """A fault of this unit only (see Faults.set); UNPLUG: it never answers until
        `amount` seconds have passed (or CLEAR); RESET: back to its factory values at once;
        POWERCYCLE: unplugged for `amount` seconds, then back at its factory values."""
        kind = kind.upper()
        if kind == "RESET":
            self.reset()
            return
        if kind == "POWERCYCLE":
            self._reset_at_plug = True
            kind = "UNPLUG"
        was_unplugged = self.unplugged
        self.faults.set(kind, amount, time.monotonic())
        if self._replug is not None and (kind in ("UNPLUG", "CLEAR")):
            self._replug.cancel()
            self._replug = None
        if kind == "UNPLUG":
            log.info("fake line: unit %s unplugged for %s s", self.address, amount)
            self._replug = asyncio.get_running_loop().call_later(amount, self._plug)
        elif kind == "CLEAR" and was_unplugged:
            self._plug()
        self.line.notify()

    def reset(self) -> None:
        self.core.reset(time.monotonic())
        self.reset_count += 1
        log.info("fake line: unit %s back at its factory values", self.address)
        self.line.notify()

    def _plug(self) -> None:
        self._replug = None
        self.faults.unplugged_until = None
        self.plug_count += 1
        log.info("fake line: unit %s plugged in again", self.address)
        if self._reset_at_plug:
            self._reset_at_plug = False
            self.reset()
        self.line.notify()

    def _cancel_timers(self) -> None:
        if self._replug is not None:
            self._replug.cancel()
            self._replug = None
