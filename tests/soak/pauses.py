"""The soak process's own pauses, kept short and measured.

The store, the fake line, the load and the liveness sampler all run in the soak's one Python
process. When that process stops for a while, the store stops with it: a lease expires late,
a grant waits, and the pair looks slow for what the harness did. A 30-minute run keeps every
request, transaction and log line for the checker, and a full collection of Python's cyclic
garbage collector walks all of them while holding the GIL. Late in such runs the store was
seen to take no request at all for half a second, twice pushing a takeover at TTL 1 s past
its bound; with the freezing below, the longest collection in four such runs was 29 ms.

So the soak moves what it has kept out of the collector's sight every few seconds
(`gc.freeze()`: a collection then walks only what came since), and measures what is left:
the longest collection, the longest the store's event loop was late for a timer, and the
longest a thread of the process was late to wake (the whole process held: the GIL, or the
machine's CPUs busy elsewhere), all in the JSON line beside the checks they could spoil.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Pauses:
    freeze_every_s: float = 5.0
    probe_every_s: float = 0.025
    longest_gc_s: float = 0.0
    collections_over_50ms: int = 0
    longest_loop_stall_s: float = 0.0
    loop_stalls_over_100ms: int = 0
    longest_thread_stall_s: float = 0.0
    _gc_started: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _probe: asyncio.Handle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        gc.callbacks.append(self._on_gc)
        self._thread = threading.Thread(target=self._freeze, name="soak-gc-freeze", daemon=True)
        self._thread.start()
        loop.call_soon_threadsafe(self._arm, loop, time.monotonic())

    def stop(self) -> None:
        self._stop.set()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._thread is not None:
            self._thread.join(5)

    def report(self) -> dict[str, float | int]:
        return {
            "harness: longest garbage collection ms": round(self.longest_gc_s * 1000),
            "harness: garbage collections over 50 ms": self.collections_over_50ms,
            "harness: longest stall of the store's event loop ms": round(
                self.longest_loop_stall_s * 1000
            ),
            "harness: store event loop stalls over 100 ms": self.loop_stalls_over_100ms,
            "harness: longest stall of a thread ms": round(self.longest_thread_stall_s * 1000),
        }

    def _freeze(self) -> None:
        # Also wakes every probe step, to time the whole process's stalls.
        frozen = time.monotonic()
        due = frozen + self.probe_every_s
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            now = time.monotonic()
            self.longest_thread_stall_s = max(self.longest_thread_stall_s, now - due)
            due = now + self.probe_every_s
            if now - frozen >= self.freeze_every_s:
                gc.freeze()
                frozen = now

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            took = time.perf_counter() - self._gc_started
            self._gc_started = None
            self.longest_gc_s = max(self.longest_gc_s, took)
            if took > 0.05:
                self.collections_over_50ms += 1

    def _arm(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        # A timer on the store's loop: how late it runs is how long the loop could not.
        late = time.monotonic() - due
        self.longest_loop_stall_s = max(self.longest_loop_stall_s, late)
        if late > 0.1:
            self.loop_stalls_over_100ms += 1
        if not self._stop.is_set():
            self._probe = loop.call_later(
                self.probe_every_s, self._arm, loop, time.monotonic() + self.probe_every_s
            )
