"""What every blocking-port driver shares: one worker thread, availability, reopening
with backoff, and the write policy (validate, write only on change, space writes out,
read back).

A subclass supplies the blocking operations (`_io_*`), which run one at a time on the
driver's single worker thread and raise LinkLost when the port itself failed,
ControllerUnavailable when the controller did not answer in time, and ControllerError
when it answered wrongly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import TypeVar

from agent.controller.interface import (
    AvailabilityCallback,
    Controller,
    ControllerError,
    ControllerFault,
    ControllerState,
    ControllerUnavailable,
    Limits,
    as_finite_number,
    validate_setpoint,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MIN_WRITE_INTERVAL_S = 1.0
DEFAULT_BACKOFF_INITIAL_S = 1.0
DEFAULT_BACKOFF_MAX_S = 30.0


def backoff_delays(initial_s: float, max_s: float) -> Iterator[float]:
    """initial, 2 x initial, 4 x initial, ... capped at max_s, forever."""
    delay = initial_s
    while True:
        yield delay
        delay = min(delay * 2, max_s)


class LinkLost(Exception):
    """The port failed (unplugged, connection dropped): close it and reopen it."""


class WriteNotAllowed(ControllerError):
    """The caller's `allowed` check said no at the last moment; nothing was written."""


class SetpointRejected(ControllerError):
    """The controller refused the set point (its limits may have changed)."""


class _Link(Enum):
    DOWN = "down"  # port closed, a reopen is scheduled
    UP = "up"  # port open, state read since it was opened
    CLOSED = "closed"  # closed by the owner


class BlockingPortDriver(Controller):
    def __init__(
        self,
        *,
        name: str,
        io_timeout_s: float,
        min_write_interval_s: float = DEFAULT_MIN_WRITE_INTERVAL_S,
        backoff_initial_s: float = DEFAULT_BACKOFF_INITIAL_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        on_availability: AvailabilityCallback | None = None,
    ) -> None:
        if not min_write_interval_s >= 0:
            raise ValueError(f"min_write_interval_s must be >= 0, not {min_write_interval_s}")
        if not 0 < backoff_initial_s <= backoff_max_s:
            raise ValueError(
                f"need 0 < backoff_initial_s <= backoff_max_s, got "
                f"{backoff_initial_s} and {backoff_max_s}"
            )
        if not io_timeout_s > 0:
            raise ValueError(f"io_timeout_s must be > 0, not {io_timeout_s}")
        self.name = name
        self.min_write_interval_s = min_write_interval_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._io_timeout_s = io_timeout_s
        self._on_availability = on_availability
        self._executor: ThreadPoolExecutor | None = None
        self._link = _Link.CLOSED
        self._available = False
        self._available_event: asyncio.Event | None = None
        self._io_lock: asyncio.Lock | None = None
        self._write_lock: asyncio.Lock | None = None
        self._reopen_task: asyncio.Task[None] | None = None
        self._needs_resync = True
        self._limits: Limits | None = None
        self._state: ControllerState | None = None
        self._last_write_at: float | None = None
        self.reopen_count = 0
        """How often the port was reopened after it was lost."""

    # --- the blocking side, implemented by each driver (worker thread only) -------------

    @abstractmethod
    def _io_open(self) -> None: ...

    @abstractmethod
    def _io_close(self) -> None:
        """Close the port; must not raise."""

    @abstractmethod
    def _io_read_state(self) -> ControllerState: ...

    @abstractmethod
    def _io_read_limits(self) -> Limits: ...

    @abstractmethod
    def _io_read_setpoint(self) -> float: ...

    @abstractmethod
    def _io_read_temperature(self) -> float: ...

    @abstractmethod
    def _io_write_setpoint(self, value: float) -> float:
        """Write `value`; return what the controller says it stored."""

    # --- state ------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        return self._available

    @property
    def limits(self) -> Limits | None:
        """The limits last read."""
        return self._limits

    @property
    def last_state(self) -> ControllerState | None:
        """The state last read (the set point is updated by writes)."""
        return self._state

    async def wait_available(self, timeout_s: float) -> bool:
        """Wait until the controller is available; False if `timeout_s` passed first."""
        if self._available_event is None:
            return False
        try:
            await asyncio.wait_for(self._available_event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _set_available(self, available: bool) -> None:
        if available == self._available:
            return
        self._available = available
        if self._available_event is not None:
            if available:
                self._available_event.set()
            else:
                self._available_event.clear()
        if not available:
            # Whatever happened at the device meanwhile, read it before writing to it.
            self._needs_resync = True
        if self._on_availability is not None:
            try:
                self._on_availability(available)
            except Exception:
                log.exception("%s: availability callback failed", self.name)

    # --- lifecycle --------------------------------------------------------------------

    async def open(self) -> None:
        """Open the port and read limits and state.

        If that fails the controller is marked unavailable and reopened in the
        background with backoff; open() itself does not raise for a missing device.
        """
        if self._link is not _Link.CLOSED:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        self._available_event = asyncio.Event()
        self._io_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self._link = _Link.DOWN
        try:
            async with self._io_lock:
                await self._reopen_once()
        except (LinkLost, ControllerFault) as exc:
            log.warning("%s: controller unavailable at start: %s", self.name, exc)
            self._schedule_reopen()
            return
        except BaseException:
            await self.close()
            raise
        log.info("%s: controller opened", self.name)

    async def close(self) -> None:
        if self._link is _Link.CLOSED:
            return
        self._link = _Link.CLOSED
        if self._reopen_task is not None:
            self._reopen_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reopen_task
            self._reopen_task = None
        await self._close_port()
        self._set_available(False)
        if self._executor is not None:
            # A call stuck in the worker must not hold up the loop; the thread ends
            # when that call returns.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def _run(self, function: Callable[..., T], *args: object) -> T:
        """Run a blocking call on the worker thread, bounded by io_timeout_s."""
        if self._executor is None:
            raise ControllerUnavailable(f"{self.name}: driver is closed")
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._executor, function, *args)
        except RuntimeError as exc:  # the executor was shut down by close()
            raise ControllerUnavailable(f"{self.name}: driver is closed") from exc
        try:
            return await asyncio.wait_for(future, self._io_timeout_s)
        except TimeoutError as exc:
            # The worker is stuck in a call that should have timed out by itself.
            raise LinkLost(f"port call did not return within {self._io_timeout_s} s") from exc

    async def _close_port(self) -> None:
        if self._executor is None:
            return
        try:
            await self._run(self._io_close)
        except Exception as exc:  # closing is best effort
            log.debug("%s: closing the port failed: %s", self.name, exc)

    async def _reopen_once(self) -> None:
        """Open the port and read limits and state, as one step."""
        try:
            await self._run(self._io_open)
            limits = await self._run(self._io_read_limits)
            state = await self._run(self._io_read_state)
        except BaseException:
            await self._close_port()
            raise
        self._limits, self._state = limits, state
        self._needs_resync = False
        self._link = _Link.UP
        self._set_available(True)

    def _schedule_reopen(self) -> None:
        if self._reopen_task is None or self._reopen_task.done():
            self._reopen_task = asyncio.create_task(self._reopen_loop(), name=f"{self.name}-reopen")

    async def _reopen_loop(self) -> None:
        delays = backoff_delays(self.backoff_initial_s, self.backoff_max_s)
        attempts = 0
        while self._link is _Link.DOWN:
            await asyncio.sleep(next(delays))
            if self._link is not _Link.DOWN:
                return
            attempts += 1
            assert self._io_lock is not None
            try:
                async with self._io_lock:
                    await self._reopen_once()
            except (LinkLost, ControllerFault) as exc:
                log.debug("%s: reopen attempt %d failed: %s", self.name, attempts, exc)
                continue
            except Exception:
                log.exception("%s: reopen attempt %d failed", self.name, attempts)
                continue
            self.reopen_count += 1
            log.info("%s: controller reopened after %d attempt(s)", self.name, attempts)
            return

    async def _lose_link(self, exc: BaseException) -> None:
        if self._link is not _Link.UP:
            return
        self._link = _Link.DOWN
        log.warning("%s: controller unavailable, reopening: %s", self.name, exc)
        await self._close_port()
        self._set_available(False)
        self._schedule_reopen()

    # --- requests ---------------------------------------------------------------------

    async def _call(self, function: Callable[..., T], *args: object) -> T:
        """One request: one at a time, mapped onto the driver's exceptions."""
        if self._link is _Link.CLOSED:
            raise ControllerUnavailable(f"{self.name}: driver is not open")
        assert self._io_lock is not None
        async with self._io_lock:
            if self._link is not _Link.UP:
                raise ControllerUnavailable(f"{self.name}: controller is gone, reopening")
            try:
                result = await self._run(function, *args)
            except LinkLost as exc:
                await self._lose_link(exc)
                raise ControllerUnavailable(f"{self.name}: {exc}") from exc
            except ControllerUnavailable as exc:
                if self._available:
                    log.warning("%s: controller unavailable: %s", self.name, exc)
                self._set_available(False)
                raise
            except ControllerError:
                raise
            except Exception as exc:
                # A driver bug or an undocumented library exception: report it as the
                # controller's fault rather than crash the caller.
                log.exception("%s: unexpected error", self.name)
                raise ControllerError(f"{self.name}: unexpected error: {exc!r}") from exc
        if not self._available:
            log.info("%s: controller answers again", self.name)
            self._set_available(True)
        return result

    async def _resync(self) -> None:
        limits = await self._call(self._io_read_limits)
        state = await self._call(self._io_read_state)
        self._limits, self._state = limits, state
        self._needs_resync = False

    async def read_state(self) -> ControllerState:
        state = await self._call(self._io_read_state)
        self._state = state
        return state

    async def read_limits(self) -> Limits:
        limits = await self._call(self._io_read_limits)
        self._limits = limits
        return limits

    async def read_setpoint(self) -> float:
        return await self._call(self._io_read_setpoint)

    async def read_temperature(self) -> float:
        return await self._call(self._io_read_temperature)

    async def write_setpoint(
        self, value: object, *, allowed: Callable[[], bool] | None = None
    ) -> float:
        """Write a set point and return the value read back from the controller.

        The value is checked against the controller's limits and rounded to its step
        (InvalidSetpoint, nothing written, if it is not a finite number within them).
        It is written only if the controller holds a different value, and never sooner
        than min_write_interval_s after the previous write: this call waits for that.
        After the controller was unavailable, limits and state are read again first.
        `allowed` is asked right before the bytes go out (after any wait): the owner of a
        lease uses it so that nothing is written once the lease has run out.
        """
        as_finite_number(value)  # reject non-numbers before any I/O
        if self._write_lock is None:
            raise ControllerUnavailable(f"{self.name}: driver is not open")
        async with self._write_lock:
            if self._needs_resync or self._limits is None:
                await self._resync()
            assert self._limits is not None
            target = validate_setpoint(value, self._limits)
            current = await self._call(self._io_read_setpoint)
            if math.isclose(current, target, abs_tol=1e-9):
                log.debug("%s: set point already %s, not written", self.name, current)
                return current
            await self._wait_write_interval()
            if allowed is not None and not allowed():
                raise WriteNotAllowed(f"{self.name}: write of {target} withdrawn")
            try:
                stored = await self._call(self._io_write_setpoint, target)
            except SetpointRejected:
                self._needs_resync = True  # the limits we checked against are stale
                raise
            finally:
                # Measured from the end of the write: the device has it by then.
                self._last_write_at = time.monotonic()
            readback = await self._call(self._io_read_setpoint)
            if not math.isclose(readback, target, abs_tol=1e-9):
                log.warning(
                    "%s: wrote %s, controller stored %s, reads back %s",
                    self.name,
                    target,
                    stored,
                    readback,
                )
            else:
                log.debug("%s: set point written: %s", self.name, readback)
            if self._state is not None:
                self._state = dataclasses.replace(self._state, setpoint=readback)
            return readback

    async def _wait_write_interval(self) -> None:
        if self._last_write_at is None:
            return
        remaining = self._last_write_at + self.min_write_interval_s - time.monotonic()
        if remaining > 0:
            log.debug("%s: waiting %.3f s before the next write", self.name, remaining)
            await asyncio.sleep(remaining)
