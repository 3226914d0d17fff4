"""Precise waits for the fake line's emulated line time.

asyncio's timers wait in epoll, whose timeout is whole milliseconds rounded up: a timer
fires up to a millisecond late, about 0.9 ms on average on a VM. For a 10 ms Modbus
transaction at 19200 baud that is 9 %, which would show in every benchmark of the agent
as its own overhead. A thread sleeping in clock_nanosleep and waking the loop is late by
about a quarter of that, and never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class PreciseSleeper:
    """Sleeps to monotonic deadlines, one thread per sleeper, started on first use.

    Its queue holds at most one wait per caller in flight: the fake line sleeps under its
    one-transaction-at-a-time lock, so at most one.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._waits: queue.SimpleQueue[
            tuple[float, asyncio.AbstractEventLoop, asyncio.Future[None]] | None
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def sleep_until(self, deadline: float) -> None:
        """Return at time.monotonic() >= deadline (never early)."""
        if deadline <= time.monotonic():
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self._waits.put((deadline, loop, future))
        await future

    def _run(self) -> None:
        while (wait := self._waits.get()) is not None:
            deadline, loop, future = wait
            remaining = deadline - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)
            with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile
                loop.call_soon_threadsafe(_wake, future)

    def close(self) -> None:
        """Let the thread end (after the wait it may be in); it can start again later."""
        if self._thread is not None:
            self._waits.put(None)
            self._thread = None
