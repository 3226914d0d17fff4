"""The soak's load: remote and panel changes on a thread of their own, independent of the
faults.

- Remote changes: `remote_per_unit_s` a second for every unit (1: each unit gets one a
  second), each at its own phase, fenced with the current version of the line's lock (read
  just before, as `agent setpoint` does; a write refused for "a lower version" is tried
  once more with the lock read again).
- Panel changes at random units, `panel_per_unit_s` a second for every unit, each to
  another value than the unit holds and than the agent last synced for it.
- Panel changes during a write wait: after a remote change, now and then, a panel change of
  the same unit within its least write interval.

A change due while the thread is more than a second behind (the store is away, and each
attempt waits for its timeout) is skipped and counted, not made late.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import random
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from tests.soak.world import VALUES, device_id
from tests.support.paho_client import PahoStoreClient

if TYPE_CHECKING:
    from tests.soak.world import World

LATE_S = 1.0
NO_LOCK = b"$-1\r\n"
OK = b"+OK\r\n"


class Load:
    def __init__(
        self,
        world: World,
        seed: int,
        *,
        remote_per_unit_s: float = 1.0,
        panel_per_unit_s: float = 0.25,
        panel_in_write_wait: float = 0.2,
    ) -> None:
        self.world = world
        self.rng = random.Random(seed)
        self.remote_per_unit_s = remote_per_unit_s
        self.panel_per_unit_s = panel_per_unit_s
        self.panel_in_write_wait = panel_in_write_wait
        self.made: dict[str, int] = defaultdict(int)
        self.recent: dict[int, list[float]] = defaultdict(list)
        self._client: PahoStoreClient | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._due: list[tuple[float, int, str, int]] = []
        self._order = 0

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        now = time.monotonic()
        if self.remote_per_unit_s > 0:
            period = 1 / self.remote_per_unit_s
            for slot in self.world.slots:
                self._at(now + self.rng.uniform(0, period), "remote", slot)
        if self.panel_per_unit_s > 0:
            self._at(now + self._panel_gap(), "panel", 0)
        self._thread = threading.Thread(target=self._run, name="soak-load", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)
        if self._client is not None:
            self._client.close()
            self._client = None

    def _at(self, when: float, kind: str, slot: int) -> None:
        self._order += 1
        heapq.heappush(self._due, (when, self._order, kind, slot))

    def _panel_gap(self) -> float:
        return self.rng.expovariate(self.panel_per_unit_s * len(self.world.slots))

    def _run(self) -> None:
        while not self._stop.is_set() and self._due:
            when, _, kind, slot = heapq.heappop(self._due)
            wait = when - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                return
            late = time.monotonic() - when > LATE_S
            if kind == "remote":
                self._at(when + 1 / self.remote_per_unit_s, "remote", slot)
                if late:
                    self.made["remote_skipped_late"] += 1
                else:
                    self.remote(slot)
            elif kind == "panel":
                self._at(when + self._panel_gap(), "panel", 0)
                if late:
                    self.made["panel_skipped_late"] += 1
                else:
                    self.panel(self.rng.choice(self.world.slots), "panel")
            elif not late:  # a panel change within the unit's write wait
                self.panel(slot, "panel_in_write_wait")

    # ------------------------------------------------------------------ changes

    def value(self, slot: int, besides: tuple[float | None, ...] = ()) -> float:
        """A value for a change of `slot`: none of its last few, and none of `besides`."""
        recent = self.recent[slot]
        value = self.rng.choice([v for v in VALUES if v not in recent and v not in besides])
        recent.append(value)
        del recent[:-8]
        return value

    def panel(self, slot: int, kind: str) -> None:
        """Turns the knob of `slot` to another value than it holds, and than the value the
        agent last synced for it: a knob turned to the value the unit holds changes nothing,
        and one turned back to the last synced value cannot be told from no change by
        anyone who did not see the values in between (README, "A failover")."""
        unit = self.world.unit_at(slot)
        world = self.world
        record = f"{device_id(slot)}\\synced".encode()

        def turn() -> None:
            synced = None
            if world.store_up:
                entry = world.store.store.entry(record)
                with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
                    synced = float(json.loads(entry.value)["value"])  # type: ignore[union-attr]
            unit.panel_setpoint(self.value(slot, besides=(unit.setpoint, synced)))

        try:
            world.background.call(turn)
        except Exception:
            self.made[f"{kind}_failed"] += 1
            return
        self.made[kind] += 1

    def remote(self, slot: int) -> None:
        value = self.value(slot)
        outcome = self._set(slot, value)
        if outcome == "refused":
            self.made["remote_retried"] += 1
            outcome = self._set(slot, value)
        self.made["remote" if outcome == "accepted" else f"remote_{outcome}"] += 1
        if outcome == "accepted" and self.rng.random() < self.panel_in_write_wait:
            delay = self.rng.uniform(0.02, max(0.03, self.world.min_write_interval_s))
            self._at(time.monotonic() + delay, "panel_in_write_wait", slot)

    def _set(self, slot: int, value: float) -> str:
        try:
            client = self._connected()
            lock = client.request("GET", self.world.lock_key)
            token = lock.prop("__ts")
            if lock.payload == NO_LOCK or token is None:
                return "no_active"
            reply = client.request("SET", f"{device_id(slot)}\\setPoint", f"{value:.1f}", ft=token)
        except Exception:
            self._drop()
            return "failed"
        return "accepted" if reply.payload == OK else "refused"

    def _connected(self) -> PahoStoreClient:
        if self._client is None or self._client.disconnected.is_set():
            self._drop()
            world = self.world
            self._client = PahoStoreClient(
                "127.0.0.1", world.port, f"soak-load-{time.monotonic_ns()}"
            )
        return self._client

    def _drop(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
