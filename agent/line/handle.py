"""A unit on the bus as the sync sees a controller: its urgent work goes through the bus
(agent.line.bus), what the bus last read and wrote of it is kept here."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

from agent.controller import points
from agent.controller.driver import Unit
from agent.controller.interface import (
    Controller,
    ControllerError,
    ControllerState,
    Limits,
    PointValue,
    SetpointRejected,
    as_finite_number,
    validate_setpoint,
)
from agent.line.schedule import Kind, Op

log = logging.getLogger("agent.line.bus")

AvailabilityHandler = Callable[[str, bool], None]


class Carrier(Protocol):
    """What a handle needs of its bus."""

    on_availability: AvailabilityHandler | None

    @property
    def line_up(self) -> bool: ...

    async def run(self, op: Op, allowed: Callable[[], bool] | None = None) -> Any: ...


class DeviceHandle(Controller):
    """One unit on the bus, as the sync sees a controller."""

    def __init__(self, bus: Carrier, unit: Unit) -> None:
        self.bus = bus
        self.unit = unit
        self.name = unit.name
        self._limits: Limits | None = None
        self._state: ControllerState | None = None
        self._state_at: float | None = None
        self._write_at: float | None = None
        self._available = True
        self._availability_event = asyncio.Event()
        self._availability_event.set()
        self._reads: dict[Kind, asyncio.Future[Any]] = {}
        """The read of each kind in progress, which callers asking meanwhile share."""

    @property
    def available(self) -> bool:
        return self._available and self.bus.line_up

    @property
    def limits(self) -> Limits | None:
        """The limits last read."""
        return self._limits

    @property
    def last_state(self) -> ControllerState | None:
        """The state last read (its set point updated by writes)."""
        return self._state

    @property
    def last_state_at(self) -> float | None:
        """When (monotonic) the last reading or write of the unit ended on the wire."""
        return self._state_at

    @property
    def last_write_at(self) -> float | None:
        """When (monotonic) the last write to the unit ended on the wire: it may have
        reached the unit even if no answer came."""
        return self._write_at

    def fresh(self, now: float, within_s: float, after: float = float("-inf")) -> bool:
        """The newest reading ended after `after`, and within `within_s` of `now`."""
        at = self._state_at
        return self._state is not None and at is not None and after <= at and now - at <= within_s

    def set_available(self, available: bool) -> None:
        """On the event loop: the unit left or rejoined (or the whole line did)."""
        if available == self._available:
            return
        self._available = available
        if available:
            self._availability_event.set()
        else:
            self._availability_event.clear()
            self._limits = None  # read again before the next write
        if self.bus.on_availability is not None:
            try:
                self.bus.on_availability(self.name, available)
            except Exception:
                log.exception("%s: availability handler failed", self.name)

    def note_result(self, op: Op, result: Any, at: float) -> None:
        """On the bus's thread: what a transaction read, and when it ended (single
        assignments)."""
        if op.kind is Kind.LIMITS:
            self._limits = result
        elif op.kind is Kind.WRITE:
            self._write_at = at
            state = self._state
            if state is not None:
                if op.point == "setPoint":
                    self._state = dataclasses.replace(state, setpoint=result)
                else:
                    self._state = dataclasses.replace(
                        state, points={**state.points, op.point: result}
                    )
                self._state_at = at
        else:
            self._state, self._state_at = result, at

    def note_write_in_doubt(self, at: float) -> None:
        """On the bus's thread: a write went out and no good answer came."""
        self._write_at = at

    async def open(self) -> None:
        """The bus opens the port; a unit has nothing of its own to open."""

    async def close(self) -> None:
        """The bus closes the port."""

    async def wait_available(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._availability_event.wait()
        return self.available

    async def read_state(self) -> ControllerState:
        """The unit's whole state, in one exchange. The points of a unit that ask at once
        (a re-check, a takeover, a unit back) share the read in progress: a whole
        thermostat costs one transaction, not one per point. (A write that needs a reading
        newer than its decision reads again right before it: see Bus._transact.)"""
        state: ControllerState = await self._shared(Kind.READ)
        return state

    async def read_limits(self) -> Limits:
        limits: Limits = await self._shared(Kind.LIMITS)
        return limits

    async def _shared(self, kind: Kind) -> Any:
        running = self._reads.get(kind)
        if running is None or running.done():
            running = self._reads[kind] = asyncio.ensure_future(self.bus.run(Op(self.name, kind)))
            running.add_done_callback(_retrieved)
        return await asyncio.shield(running)

    async def write_setpoint(
        self,
        value: object,
        *,
        allowed: Callable[[], bool] | None = None,
        expected: float | None = None,
        fresh_after: float | None = None,
    ) -> float:
        """Checks the value against the controller's limits (InvalidSetpoint, nothing
        written), rounds it to the step, writes it (never sooner than the unit's least
        write interval after its previous write) and returns the value read back.
        `allowed` is asked right before the bytes go out. With `expected`, the write goes
        out only if the unit still holds that set point, read right before it unless a
        reading taken after `fresh_after` was the transaction just before (ReadingChanged
        otherwise, with the new reading)."""
        as_finite_number(value)  # reject non-numbers before any I/O
        limits = self._limits or await self.read_limits()
        target = validate_setpoint(value, limits)
        op = Op(
            self.name,
            Kind.WRITE,
            target,
            expected=expected,
            fresh_after=float("-inf") if fresh_after is None else fresh_after,
        )
        try:
            stored: float = await self.bus.run(op, allowed)
        except SetpointRejected:
            self._limits = None  # the limits we checked against are stale
            raise
        if not math.isclose(stored, target, abs_tol=1e-9):
            log.warning("%s: wrote %s, the controller holds %s", self.name, target, stored)
        return stored

    async def write_point(
        self,
        point: str,
        value: PointValue,
        *,
        allowed: Callable[[], bool] | None = None,
        expected: PointValue | None = None,
        fresh_after: float | None = None,
    ) -> PointValue:
        """`write_setpoint` for any point of the unit's profile: a number checked against
        its limits and rounded to its step, a choice or a switch checked (InvalidValue,
        nothing written)."""
        if point == "setPoint":
            return await super().write_point(
                point, value, allowed=allowed, expected=expected, fresh_after=fresh_after
            )
        profile = self.unit.profile
        if profile is None or point not in profile.writable:
            raise ControllerError(f"{self.name} has no point {point} it can be written")
        target = points.validate(points.point(point), value, profile.limits(point))
        op = Op(
            self.name,
            Kind.WRITE,
            target,
            expected=expected,
            fresh_after=float("-inf") if fresh_after is None else fresh_after,
            point=point,
        )
        stored: PointValue = await self.bus.run(op, allowed)
        if not points.same(stored, target):
            log.warning("%s: wrote %s %s, the unit holds %s", self.name, point, target, stored)
        return stored


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A shared read whose every caller gave up: its failure is nobody's to report."""
    if not future.cancelled():
        future.exception()
