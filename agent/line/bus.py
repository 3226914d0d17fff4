"""The bus: one driver on one port, one transaction at a time, in the schedule's order.

The driver's calls block, so the line is driven from a thread of its own: it asks the
schedule for the next transaction, carries it out, keeps the line quiet for its silent
interval, and tells the event loop only what the loop needs to know (an urgent request's
answer, a reading that differs, a unit that left or came back). A routine poll that finds
nothing new costs the event loop nothing. A port that fails is closed and reopened with
backoff while every unit on it is reported unavailable; a unit that stops answering is
quarantined by the schedule, and the port stays open for the others.

Urgent work comes through `DeviceHandle` (one per unit, the API the sync uses); routine
polls are the bus's own, and their readings go to `on_reading`, with the time the reading
ended on the wire.

Every transaction passes the `gate` right before its first byte (the driver's contract,
agent.controller.driver). A write decided on a reading (`expected`) goes out only if the
unit still holds that: the bus reads the unit right before the write, back to back, unless
the newest reading is fresh (taken by the transaction just before), and a unit that changed
meanwhile fails the write with ReadingChanged, carrying the new reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.controller import points
from agent.controller.driver import Driver, Gate, GateClosed, LinkLost, Unit, open_gate
from agent.controller.interface import (
    ControllerError,
    ControllerFault,
    ControllerState,
    ControllerUnavailable,
    NotReadBeforeWrite,
    NotSent,
    ReadingChanged,
    Superseded,
    WriteNotAllowed,
)
from agent.line.handle import AvailabilityHandler, DeviceHandle
from agent.line.schedule import BusSchedule, Change, Kind, Op, Outcome, Refused
from agent.tally import Tally

log = logging.getLogger(__name__)

DEFAULT_BACKOFF_INITIAL_S = 1.0
DEFAULT_BACKOFF_MAX_S = 30.0
GATE_RETRY_S = 0.01

# A transaction's result, as counted (agent.tally): answered, no answer, a garbled answer,
# an exception reply (or a driver's error), not sent because the lease's gate said no, or
# the port itself gone.
OK, TIMEOUT, CORRUPT, EXCEPTION, REFUSED, LINE_DOWN = (
    "ok", "timeout", "corrupt", "exception", "refused", "line_down"
)  # fmt: skip
OPENED, LOST = "opened", "lost"
TRANSACTION_BOUNDS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""A transaction's time: a few ms at 115200 baud, a reply timeout's worth when it fails."""


def transaction_tally() -> Tally:
    return Tally(TRANSACTION_BOUNDS_S)


"""Urgent work the gate held back (the lease did not cover it yet) is tried again after
this, while the master still drives the line: a renewal is on its way."""

ReadingHandler = Callable[[str, ControllerState, float], None]
ReadingFilter = Callable[[str, ControllerState], bool]
_TOLERANCE = 1e-6

__all__ = ["Bus", "DeviceHandle", "Superseded"]


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
        reading_wanted: ReadingFilter | None = None,
        on_availability: AvailabilityHandler | None = None,
        on_stopped: Callable[[], None] | None = None,
        gate: Gate = open_gate,
        driving: Callable[[], bool] | None = None,
        transactions: Tally | None = None,
        line_events: Tally | None = None,
        **schedule_options: Any,
    ) -> None:
        """`reading_wanted(name, state)` is asked on the bus's thread for every routine
        reading: only those it wants are handed to `on_reading` (on the event loop).

        `gate(lasts_s)` is asked on the bus's thread right before every transaction's first
        byte, a read as much as a write (the driver's contract): a master that may no
        longer drive the line (its lease ended while it was paused, say, or would end
        before the transaction does) must not put a single frame on it, even before the
        event loop has caught up and closed the bus. It must only read state. While
        `driving()` still says yes, urgent work the gate held back waits for the lease to be
        renewed instead of failing.

        `on_stopped()` is called (on the event loop) if the bus's thread ends by a fault of
        its own, not by close(): the line is no longer driven.

        `transactions` counts each transaction by (unit, function, result), its time by function,
        `line_events` the port opened and lost (both given by the owner, so that the counts
        outlive this bus: a takeover makes a new one)."""
        if not units:
            raise ValueError("a bus needs at least one unit")
        if not 0 < backoff_initial_s <= backoff_max_s:
            raise ValueError("need 0 < backoff_initial_s <= backoff_max_s")
        self.driver = driver
        self.units = {unit.name: unit for unit in units}
        poll_s = driver.timing.transaction_s(*driver.poll_frame)
        self.fresh_s = poll_s
        """A reading younger than this (one poll's line time: the transaction just before)
        needs no read again before a write."""
        # After an urgent read (a sync reads, then writes) routine polls wait as long for
        # the write, so that no poll of another unit makes the reading stale meanwhile.
        schedule_options.setdefault("write_hold_s", poll_s)
        self.schedule = BusSchedule(
            [unit.name for unit in units],
            poll_interval_s=poll_interval_s,
            min_write_interval_s=min_write_interval_s,
            poll_s=poll_s,
            # The first routine cycle one interval from now: whoever opens the line reads
            # what it needs first (a takeover reads every device anyway).
            now=time.monotonic() + poll_interval_s,
            **schedule_options,
        )
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.on_reading = on_reading
        self.reading_wanted = reading_wanted
        self.on_availability = on_availability
        self.on_stopped = on_stopped
        self.gate = gate
        self.driving = driving
        self.transactions = transactions if transactions is not None else transaction_tally()
        self.line_events = line_events if line_events is not None else Tally()
        self.handles = {name: DeviceHandle(self, unit) for name, unit in self.units.items()}
        self.reopen_count = 0
        """How often the port was reopened after it was lost."""
        # Shared between the event loop and the bus's thread: the schedule and the waiters.
        self._mutex = threading.Lock()
        self._waiters: dict[int, _Waiter] = {}
        self._side_calls: deque[tuple[Callable[[], Any], asyncio.Future[Any]]] = deque()
        self._work = threading.Event()
        self._closing = threading.Event()
        self._open_lock = threading.Lock()
        """Held while the bus is open, released by close(): the bus's thread waits out the
        silent interval on it (see _quiet)."""
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._line_up = False
        self._opened = asyncio.Event()  # the first open attempt is over
        self._line_event = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle

    @property
    def withheld(self) -> int:
        """Transactions not put on the line because the gate said no (every bus's)."""
        return sum(n for (_, _, result), n in self.transactions.items() if result == REFUSED)

    @property
    def line_up(self) -> bool:
        return self._line_up

    def device(self, name: str) -> DeviceHandle:
        return self.handles[name]

    async def open(self) -> None:
        """Open the port and start driving the line. A port that cannot be opened is
        retried in the background (every unit unavailable meanwhile); never raises for it."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._closing.clear()
        self._open_lock.acquire(blocking=False)
        # The thread logs with the context (line, instance) of whoever opened the bus.
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._drive,), name=f"bus {self.driver.url}", daemon=True
        )
        self._thread.start()
        await self._opened.wait()

    async def close(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self._closing.set()
        with contextlib.suppress(RuntimeError):  # released by an earlier close
            self._open_lock.release()
        self._work.set()
        # The thread ends after the transaction in progress (each is bounded by the
        # driver's timeouts), then closes the port.
        await asyncio.to_thread(thread.join, self.driver.worst_case_call_s + 5)
        self._thread = None
        self._line_up = False
        self._line_event.clear()
        self._fail_all(ControllerUnavailable(f"{self.driver.url}: the line was closed"))

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
        """Put `op` on the line ahead of the routine polls and return its result.

        `allowed`, for a write, is asked on the bus's thread right before the bytes go
        out; it must only read state (it runs off the event loop)."""
        if self._thread is None or self._closing.is_set():
            raise NotSent(f"{self.driver.url}: the line is not open")
        if not self._line_up:
            raise NotSent(f"{self.driver.url}: the line is down, reopening")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        with self._mutex:
            try:
                superseded = self.schedule.submit(op)
            except Refused as exc:
                raise NotSent(str(exc)) from None
            self._waiters[op.number] = _Waiter(future, allowed)
            replaced = self._waiters.pop(superseded.number, None) if superseded else None
        if replaced is not None and not replaced.future.done():
            replaced.future.set_exception(Superseded(f"{op.device}: a newer write took its place"))
        self._work.set()
        try:
            return await future
        finally:
            with self._mutex:
                if self._waiters.pop(op.number, None) is not None:
                    self.schedule.withdraw(op)  # cancelled before it went out

    def add_unit(self, unit: Unit, min_write_interval_s: float) -> DeviceHandle:
        """A unit joins the line (a reload): polled from the next cycle on."""
        with self._mutex:
            self.schedule.add(unit.name, min_write_interval_s)
            self.units[unit.name] = unit
            handle = self.handles[unit.name] = DeviceHandle(self, unit)
        self._work.set()
        return handle

    def remove_unit(self, name: str) -> None:
        """A unit leaves the line (a reload): its queued work fails, nothing new starts;
        a transaction with it on the line now ends as any does."""
        with self._mutex:
            dropped = self.schedule.remove(name)
        for op in dropped:
            self._answer(op, error=NotSent(f"{name} was removed from the line"))

    async def call_on_line(self, call: Callable[[], Any]) -> Any:
        """A driver call of the caller's own, between two transactions (for tests and
        tools: the identity, a raw read)."""
        if self._thread is None:
            raise ControllerUnavailable(f"{self.driver.url}: the line is not open")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        with self._mutex:
            self._side_calls.append((call, future))
        self._work.set()
        return await future

    # ------------------------------------------------------------------ the bus's thread

    def _drive(self) -> None:
        try:
            self._open_once()
            while not self._closing.is_set():
                if not self._line_up:
                    self._reopen()
                    continue
                if self._side_calls:
                    self._side_call()
                    continue
                with self._mutex:
                    item = self.schedule.next(time.monotonic())
                if isinstance(item, float):
                    self._idle_until(item)
                    continue
                self._transact(item)
                # The line stays quiet for the silent interval before the next frame.
                self._quiet()
        except Exception:
            log.exception(
                "%s: the bus stopped on a fault of its own: the line is no longer driven; "
                "the agent exits for systemd to start it again (report this)",
                self.driver.url,
            )
            if self.on_stopped is not None:
                self._post(self.on_stopped)
        finally:
            with contextlib.suppress(Exception):
                self.driver.close()
            self._post(self._opened.set)

    def _open_once(self) -> None:
        try:
            self.driver.open()
        except (LinkLost, ControllerFault) as exc:
            log.warning("%s: line unavailable at start: %s", self.driver.url, exc)
            self._post(self._set_all_available, False)
        else:
            self._line_up = True
            self.line_events.count((OPENED,))
            self._post(self._line_event.set)
            log.info("%s: line opened", self.driver.url)
        finally:
            self._post(self._opened.set)

    def _quiet(self) -> None:
        """What is left of the silent interval after a transaction (from its reply's end:
        Driver.silence_left_s)."""
        self._wait(self.driver.silence_left_s())

    def _wait(self, seconds: float) -> None:
        """A lock's timed acquire, not time.sleep(): it ends at once on close, and a sleep's
        absolute deadline is what libfaketime, which the clock tests use, breaks. Not an
        Event's wait either, which is the same timed acquire behind a condition: twice the
        CPU (measured), and this wait comes once a transaction."""
        if seconds > 0 and self._open_lock.acquire(timeout=seconds):
            self._open_lock.release()  # closing: every wait from now on ends at once

    def _idle_until(self, when: float) -> None:
        timeout = when - time.monotonic()
        if math.isinf(timeout):
            timeout = 3600.0
        if timeout > 0:
            self._work.wait(timeout)
        self._work.clear()

    def _side_call(self) -> None:
        with self._mutex:
            call, future = self._side_calls.popleft()
        try:
            result = call()
        except BaseException as exc:  # handed to the caller as it is
            self._post(_settle, future, None, exc)
        else:
            self._post(_settle, future, result, None)
        self._wait(self.driver.timing.silent_s)  # a call of any kind: the whole interval

    def _transact(self, op: Op) -> None:
        with self._mutex:
            waiter = self._waiters.get(op.number)
        if waiter is not None and waiter.future.done():
            return  # its caller gave up
        allowed = waiter.allowed if waiter is not None else None
        gate = self.gate
        if op.kind is Kind.WRITE and allowed is not None:

            def gate(lasts_s: float) -> bool:
                return allowed() and self.gate(lasts_s)

        if op.kind is Kind.WRITE and op.expected is not None:
            handle = self.handles[op.device]
            if not handle.fresh(time.monotonic(), self.fresh_s, op.fresh_after):
                # The read that protects a panel change, right before the write.
                _, error = self._carry_out(Op(op.device, Kind.READ), gate)
                if error is not None:
                    if not self._held_back(op, error):
                        self._answer(op, error=_not_read(op, error))
                    return
                self._quiet()
            state = handle.last_state
            holds = None if state is None else state.value(op.point)
            if holds is None or not points.same(holds, op.expected):
                now_holds = "nothing read" if holds is None else holds
                self._answer(
                    op,
                    error=ReadingChanged(
                        f"{op.device}: {op.point} holds {now_holds}, not {op.expected}: "
                        f"write of {op.value} not sent",
                        state,
                    ),
                )
                return
        result, error = self._carry_out(op, gate)
        if error is not None:
            if not self._held_back(op, error):
                self._answer(op, error=error)
        else:
            self._answer(op, result=result)

    def _held_back(self, op: Op, error: BaseException) -> bool:
        """True if `op` waits for the lease to cover it: the gate said no, but the master
        still drives the line (a renewal is on its way)."""
        if not isinstance(error, GateClosed) or op.kind in (Kind.POLL, Kind.PROBE):
            return False
        if self.driving is None or not self.driving():
            return False
        with self._mutex:
            self.schedule.retry_first(op)
        self._closing.wait(GATE_RETRY_S)
        return True

    def _carry_out(self, op: Op, gate: Gate) -> tuple[Any, BaseException | None]:
        """One transaction on the line: (its result, None) or (None, the error)."""
        unit = self.units[op.device]
        started = time.monotonic()
        corrupt_before = self.driver.stats.corrupt_replies
        try:
            result = self._blocking_call(op, unit, gate)
        except WriteNotAllowed as exc:  # the gate said no: nothing went out
            self.transactions.count((op.device, op.kind.value, REFUSED))
            with self._mutex:
                self.schedule.withdraw(op)
            return None, exc
        except LinkLost as exc:
            self._count(op, LINE_DOWN, started)
            with self._mutex:
                self.schedule.finished(op, Outcome.LINE_DOWN, time.monotonic())
            # Its caller learns it with everyone else's, after the units are unavailable.
            self._lose_line(exc)
            return None, ControllerUnavailable(f"{self.driver.url}: line lost: {exc}")
        except ControllerUnavailable as exc:
            garbled = self.driver.stats.corrupt_replies != corrupt_before
            self._count(op, CORRUPT if garbled else TIMEOUT, started)
            self._in_doubt(op)
            self._settle(op, Outcome.TIMEOUT, time.monotonic() - started)
            return None, exc
        except ControllerError as exc:
            garbled = self.driver.stats.corrupt_replies != corrupt_before
            self._count(op, CORRUPT if garbled else EXCEPTION, started)
            self._in_doubt(op)
            self._settle(op, Outcome.ERROR, time.monotonic() - started)
            return None, exc
        except Exception as exc:
            # A driver bug or an undocumented library exception: the unit's fault as far
            # as the caller can tell, never the end of the bus.
            log.exception("%s: unexpected error on %s", op.device, op.kind.value)
            self._count(op, EXCEPTION, started)
            self._in_doubt(op)
            self._settle(op, Outcome.ERROR)
            return None, ControllerError(f"{op.device}: unexpected error: {exc!r}")
        ended = time.monotonic()
        self.transactions.count((op.device, op.kind.value, OK))
        self.transactions.observe((op.kind.value,), ended - started)
        self._settle(op, Outcome.OK, ended - started)
        self.handles[op.device].note_result(op, result, ended)
        if op.kind in (Kind.POLL, Kind.PROBE) or (op.kind is Kind.READ and op.value is None):
            # Routine readings, and the read the bus makes before a write, go to the sync
            # if they say something new (an urgent read's caller has its answer).
            urgent = op.number in self._waiters
            if not urgent and self.on_reading is not None and self._wanted(op.device, result):
                self._post(self._deliver_reading, op.device, result, ended)
        return result, None

    def _count(self, op: Op, result: str, started: float) -> None:
        self.transactions.count((op.device, op.kind.value, result))
        self.transactions.observe((op.kind.value,), time.monotonic() - started)

    def _in_doubt(self, op: Op) -> None:
        if op.kind is Kind.WRITE:
            self.handles[op.device].note_write_in_doubt(time.monotonic())

    def _blocking_call(self, op: Op, unit: Unit, gate: Gate) -> Any:
        if op.kind is Kind.LIMITS:
            return self.driver.read_limits(unit, gate)
        if op.kind is Kind.WRITE:
            assert op.value is not None
            return self.driver.write_point(unit, op.point, op.value, gate)
        return self.driver.read_state(unit, gate)

    def _settle(self, op: Op, outcome: Outcome, took_s: float | None = None) -> None:
        with self._mutex:
            verdict = self.schedule.finished(op, outcome, time.monotonic(), took_s)
        for refused in verdict.refused:
            self._answer(refused, error=NotSent(f"{refused.device} stopped answering"))
        if verdict.change is not None:
            self._report(verdict.change)

    def _report(self, change: Change) -> None:
        if change.available:
            log.info("%s: answers again", change.device)
        else:
            log.warning(
                "%s: not answering; quarantined (probed every %g s or less often)",
                change.device,
                self.schedule.probe_initial_s,
            )
        self._post(self.handles[change.device].set_available, change.available)

    def _lose_line(self, exc: BaseException) -> None:
        if not self._line_up:
            return
        self._line_up = False
        self.line_events.count((LOST,))
        self._post(self._line_event.clear)
        log.warning("%s: line lost, reopening: %s", self.driver.url, exc)
        self._post(self._set_all_available, False)
        self._post(self._fail_all, ControllerUnavailable(f"{self.driver.url}: line lost: {exc}"))
        with contextlib.suppress(Exception):
            self.driver.close()

    def _reopen(self) -> None:
        delays = backoff_delays(self.backoff_initial_s, self.backoff_max_s)
        attempts = 0
        while not self._line_up:
            if self._closing.wait(next(delays)):
                return
            attempts += 1
            try:
                self.driver.open()
            except (LinkLost, ControllerFault) as exc:
                log.debug("%s: reopen attempt %d failed: %s", self.driver.url, attempts, exc)
                continue
            self.reopen_count += 1
            self.line_events.count((OPENED,))
            with self._mutex:
                self.schedule.rejoin_all(time.monotonic())
            self._line_up = True
            log.info("%s: line reopened after %d attempt(s)", self.driver.url, attempts)
            self._post(self._line_event.set)
            self._post(self._set_all_available, True)

    # ------------------------------------------------------------------ to the event loop

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(callback, *args)

    def _answer(self, op: Op, *, result: Any = None, error: BaseException | None = None) -> None:
        with self._mutex:
            waiter = self._waiters.pop(op.number, None)
        if waiter is not None:
            self._post(_settle, waiter.future, result, error)

    def _wanted(self, name: str, state: ControllerState) -> bool:
        if self.reading_wanted is None:
            return True
        try:
            return self.reading_wanted(name, state)
        except Exception:  # a handler's bug is never the end of the bus
            log.exception("%s: reading filter failed: the reading goes to the sync", name)
            return True

    def _deliver_reading(self, name: str, state: ControllerState, at: float) -> None:
        if self.on_reading is None:
            return
        try:
            self.on_reading(name, state, at)
        except Exception:
            log.exception("%s: reading handler failed", name)

    def _set_all_available(self, available: bool) -> None:
        for handle in self.handles.values():
            handle.set_available(available)

    def _fail_all(self, exc: BaseException) -> None:
        with self._mutex:
            for op in self.schedule.pending():
                self.schedule.withdraw(op)
            waiters, self._waiters = self._waiters, {}
            side_calls, self._side_calls = self._side_calls, deque()
        for waiter in waiters.values():
            _settle(waiter.future, None, exc)
        for _, future in side_calls:
            _settle(future, None, exc)


def _not_read(op: Op, error: BaseException) -> BaseException:
    """A write's answer when the read that guards it failed: nothing was sent (a refusal
    or a line that is down says so itself)."""
    if isinstance(error, WriteNotAllowed | NotSent) or not isinstance(error, ControllerFault):
        return error
    return NotReadBeforeWrite(
        f"{op.device}: write of {op.value} not sent: the read before it failed ({error})"
    )


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
