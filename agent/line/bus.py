"""The bus: one driver on one port, one transaction at a time, in the schedule's order.

The driver's calls block, so they run on a worker thread of the bus's own; the event loop
only waits for them, each bounded in time. Between two transactions the line stays quiet
for its silent interval. A port that fails is closed and reopened with backoff while every
unit on it is reported unavailable; a unit that stops answering is quarantined by the
schedule, and the port stays open for the others.

Urgent work comes through `DeviceHandle` (one per unit, the API the sync uses); routine
polls are the bus's own, and their readings go to `on_reading`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agent.controller.driver import Driver, LinkLost, Unit
from agent.controller.interface import (
    Controller,
    ControllerError,
    ControllerFault,
    ControllerState,
    ControllerUnavailable,
    Limits,
    SetpointRejected,
    WriteNotAllowed,
    as_finite_number,
    validate_setpoint,
)
from agent.line.schedule import BusSchedule, Change, Kind, Op, Outcome, Refused

log = logging.getLogger(__name__)

DEFAULT_BACKOFF_INITIAL_S = 1.0
DEFAULT_BACKOFF_MAX_S = 30.0

ReadingHandler = Callable[[str, ControllerState], None]
AvailabilityHandler = Callable[[str, bool], None]


class Superseded(ControllerError):
    """A newer write to the same unit took this one's place before it went out."""


def backoff_delays(initial_s: float, max_s: float) -> Iterator[float]:
    """initial, 2 x initial, 4 x initial, ... capped at max_s, forever."""
    delay = initial_s
    while True:
        yield delay
        delay = min(delay * 2, max_s)


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[Any]
    allowed: Callable[[], bool] | None = None


class Bus:
    def __init__(
        self,
        driver: Driver,
        units: Sequence[Unit],
        *,
        poll_interval_s: float = 1.0,
        min_write_interval_s: Mapping[str, float] | float = 1.0,
        backoff_initial_s: float = DEFAULT_BACKOFF_INITIAL_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        on_reading: ReadingHandler | None = None,
        on_availability: AvailabilityHandler | None = None,
        **schedule_options: Any,
    ) -> None:
        if not units:
            raise ValueError("a bus needs at least one unit")
        if not 0 < backoff_initial_s <= backoff_max_s:
            raise ValueError("need 0 < backoff_initial_s <= backoff_max_s")
        self.driver = driver
        self.units = {unit.name: unit for unit in units}
        self.schedule = BusSchedule(
            [unit.name for unit in units],
            poll_interval_s=poll_interval_s,
            min_write_interval_s=min_write_interval_s,
            # The first routine cycle one interval from now: whoever opens the line reads
            # what it needs first (a takeover reads every device anyway).
            now=time.monotonic() + poll_interval_s,
            **schedule_options,
        )
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.on_reading = on_reading
        self.on_availability = on_availability
        self.handles = {name: DeviceHandle(self, unit) for name, unit in self.units.items()}
        self.reopen_count = 0
        """How often the port was reopened after it was lost."""
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self._waiters: dict[int, _Waiter] = {}
        self._line_up = False
        self._closing = False
        self._line_event = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle

    @property
    def line_up(self) -> bool:
        return self._line_up

    def device(self, name: str) -> DeviceHandle:
        return self.handles[name]

    async def open(self) -> None:
        """Open the port and start driving the line. A port that cannot be opened is
        retried in the background (every unit unavailable meanwhile); never raises for it."""
        if self._task is not None:
            return
        self._closing = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bus")
        try:
            await self._call(self.driver.open)
        except (LinkLost, ControllerFault) as exc:
            log.warning("%s: line unavailable at start: %s", self.driver.url, exc)
            self._set_all_available(False)
        else:
            self._line_up = True
            self._line_event.set()
            log.info("%s: line opened", self.driver.url)
        self._task = asyncio.create_task(self._drive(), name=f"bus {self.driver.url}")

    async def close(self) -> None:
        if self._task is None:
            return
        self._closing = True
        self._wakeup.set()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self._fail_all(ControllerUnavailable(f"{self.driver.url}: the line was closed"))
        with contextlib.suppress(Exception):
            await self._call(self.driver.close)
        self._line_up = False
        if self._executor is not None:
            # A call stuck in the worker must not hold up the loop; the thread ends when
            # that call returns.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def __aenter__(self) -> Bus:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def wait_line_up(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._line_event.wait()
        return self._line_up

    # ------------------------------------------------------------------ urgent work

    async def run(self, op: Op, allowed: Callable[[], bool] | None = None) -> Any:
        """Put `op` on the line ahead of the routine polls and return its result."""
        if self._task is None:
            raise ControllerUnavailable(f"{self.driver.url}: the line is not open")
        if not self._line_up:
            raise ControllerUnavailable(f"{self.driver.url}: the line is down, reopening")
        try:
            superseded = self.schedule.submit(op)
        except Refused as exc:
            raise ControllerUnavailable(str(exc)) from None
        if superseded is not None:
            self._fail(superseded, Superseded(f"{op.device}: a newer write took its place"))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[op.number] = _Waiter(future, allowed)
        self._wakeup.set()
        try:
            return await future
        finally:
            if self._waiters.pop(op.number, None) is not None:
                self.schedule.withdraw(op)  # cancelled before it went out

    # ------------------------------------------------------------------ the loop

    async def _drive(self) -> None:
        # Checked as well as cancelled: a cancellation can be lost in a call that completes
        # at the same moment, and the bus must stop all the same.
        while not self._closing:
            if not self._line_up:
                await self._reopen()
                continue
            item = self.schedule.next(time.monotonic())
            if isinstance(item, float):
                await self._idle_until(item)
                continue
            await self._transact(item)
            # The line stays quiet for the silent interval before the next frame.
            await asyncio.sleep(self.driver.timing.silent_s)

    async def _idle_until(self, when: float) -> None:
        self._wakeup.clear()
        timeout = when - time.monotonic()
        if math.isinf(timeout):
            timeout = 3600.0
        if timeout > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()

    async def _transact(self, op: Op) -> None:
        waiter = self._waiters.get(op.number)
        if waiter is not None and waiter.future.done():
            return  # its caller gave up
        unit = self.units[op.device]
        allowed = waiter.allowed if waiter is not None else None
        if op.kind is Kind.WRITE and allowed is not None and not allowed():
            self._fail(op, WriteNotAllowed(f"{op.device}: write of {op.value} withdrawn"))
            return
        try:
            result = await self._call(self._blocking_call(op, unit))
        except LinkLost as exc:
            self.schedule.finished(op, Outcome.LINE_DOWN, time.monotonic())
            self._fail(op, ControllerUnavailable(f"{op.device}: {exc}"))
            await self._lose_line(exc)
            return
        except ControllerUnavailable as exc:
            self._settle(op, Outcome.TIMEOUT)
            self._fail(op, exc)
            if op.kind is Kind.PROBE:
                log.debug("%s: still not answering", op.device)
            return
        except ControllerError as exc:
            self._settle(op, Outcome.ERROR)
            self._fail(op, exc)
            return
        except Exception as exc:
            # A driver bug or an undocumented library exception: the unit's fault as far
            # as the caller can tell, never a crash of the bus.
            log.exception("%s: unexpected error on %s", op.device, op.kind.value)
            self._settle(op, Outcome.ERROR)
            self._fail(op, ControllerError(f"{op.device}: unexpected error: {exc!r}"))
            return
        self._settle(op, Outcome.OK)
        handle = self.handles[op.device]
        handle.note_result(op, result)
        if op.kind in (Kind.POLL, Kind.PROBE) and self.on_reading is not None:
            try:
                self.on_reading(op.device, result)
            except Exception:
                log.exception("%s: reading handler failed", op.device)
        waiter = self._waiters.pop(op.number, None)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result(result)

    def _blocking_call(self, op: Op, unit: Unit) -> Callable[[], Any]:
        driver = self.driver
        if op.kind is Kind.LIMITS:
            return lambda: driver.read_limits(unit)
        if op.kind is Kind.WRITE:
            assert op.value is not None
            value = op.value
            return lambda: driver.write_setpoint(unit, value)
        return lambda: driver.read_state(unit)

    def _settle(self, op: Op, outcome: Outcome) -> None:
        verdict = self.schedule.finished(op, outcome, time.monotonic())
        for refused in verdict.refused:
            self._fail(refused, ControllerUnavailable(f"{refused.device} stopped answering"))
        if verdict.change is not None:
            self._report(verdict.change)

    def _report(self, change: Change) -> None:
        handle = self.handles[change.device]
        if change.available:
            log.info("%s: answers again", change.device)
        else:
            log.warning(
                "%s: not answering; quarantined (probed every %g s or less often)",
                change.device,
                self.schedule.probe_initial_s,
            )
        handle.set_available(change.available)

    # ------------------------------------------------------------------ the port

    async def _call(self, function: Callable[[], Any]) -> Any:
        """A blocking call on the worker thread, bounded by the driver's worst case."""
        if self._executor is None:
            raise ControllerUnavailable(f"{self.driver.url}: the line is closed")
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._executor, function)
        except RuntimeError as exc:  # the executor was shut down by close()
            raise ControllerUnavailable(f"{self.driver.url}: the line is closed") from exc
        try:
            async with asyncio.timeout(self.driver.worst_case_call_s):
                return await future
        except TimeoutError as exc:
            # The worker is stuck in a call that should have timed out by itself.
            bound = self.driver.worst_case_call_s
            raise LinkLost(f"port call did not return in {bound} s") from exc

    async def _lose_line(self, exc: BaseException) -> None:
        if not self._line_up:
            return
        self._line_up = False
        self._line_event.clear()
        log.warning("%s: line lost, reopening: %s", self.driver.url, exc)
        self._fail_all(ControllerUnavailable(f"{self.driver.url}: the line is down"))
        self._set_all_available(False)
        with contextlib.suppress(Exception):
            await self._call(self.driver.close)

    async def _reopen(self) -> None:
        delays = backoff_delays(self.backoff_initial_s, self.backoff_max_s)
        attempts = 0
        while not self._line_up and not self._closing:
            await asyncio.sleep(next(delays))
            attempts += 1
            try:
                await self._call(self.driver.open)
            except (LinkLost, ControllerFault) as exc:
                log.debug("%s: reopen attempt %d failed: %s", self.driver.url, attempts, exc)
                continue
            self.reopen_count += 1
            self._line_up = True
            self._line_event.set()
            log.info("%s: line reopened after %d attempt(s)", self.driver.url, attempts)
            self.schedule.rejoin_all(time.monotonic())
            self._set_all_available(True)

    def _set_all_available(self, available: bool) -> None:
        for handle in self.handles.values():
            handle.set_available(available)

    # ------------------------------------------------------------------ waiters

    def _fail(self, op: Op, exc: BaseException) -> None:
        waiter = self._waiters.pop(op.number, None)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_exception(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for op in self.schedule.pending():
            self.schedule.withdraw(op)
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(exc)


class DeviceHandle(Controller):
    """One unit on the bus, as the sync sees a controller."""

    def __init__(self, bus: Bus, unit: Unit) -> None:
        self.bus = bus
        self.unit = unit
        self.name = unit.name
        self._limits: Limits | None = None
        self._state: ControllerState | None = None
        self._available = True
        self._availability_event = asyncio.Event()
        self._availability_event.set()

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

    def set_available(self, available: bool) -> None:
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

    def note_result(self, op: Op, result: Any) -> None:
        if op.kind is Kind.LIMITS:
            self._limits = result
        elif op.kind is Kind.WRITE:
            if self._state is not None:
                self._state = dataclasses.replace(self._state, setpoint=result)
        else:
            self._state = result

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
        result: ControllerState = await self.bus.run(Op(self.name, Kind.READ))
        return result

    async def read_limits(self) -> Limits:
        result: Limits = await self.bus.run(Op(self.name, Kind.LIMITS))
        return result

    async def write_setpoint(
        self, value: object, *, allowed: Callable[[], bool] | None = None
    ) -> float:
        """Checks the value against the controller's limits (InvalidSetpoint, nothing
        written), rounds it to the step, writes it (never sooner than the unit's least
        write interval after its previous write) and returns the value read back.
        `allowed` is asked right before the bytes go out."""
        as_finite_number(value)  # reject non-numbers before any I/O
        limits = self._limits or await self.read_limits()
        target = validate_setpoint(value, limits)
        try:
            stored: float = await self.bus.run(Op(self.name, Kind.WRITE, target), allowed)
        except SetpointRejected:
            self._limits = None  # the limits we checked against are stale
            raise
        if not math.isclose(stored, target, abs_tol=1e-9):
            log.warning("%s: wrote %s, the controller holds %s", self.name, target, stored)
        return stored
