"""The soak's load: remote and panel changes on a thread of their own, independent of the
faults.

- Remote changes: `remote_per_unit_s` a second for every unit (1: each unit gets one a
  second), each at its own phase, of one of the world's points (the set point, heating and
  cooling set points, mode, fan, occupancy), dealt to each unit from a shuffled deck so that
  a short run changes every point alike; fenced with the current version of the line's lock
  (read just before, as `agent setpoint` does; a write refused for "a lower version" is
  tried once more with the lock read again).
- Panel changes at random units (their points dealt likewise), `panel_per_unit_s` a second
  for every unit, each to another value than the unit holds, than the values of its sync
  record, and than the values its key took after the record's version for it (values a
  standby taking over could not tell from a sync; a point with no such value left, often a
  switch, is passed over for the next).
- Panel changes during a write wait: after a remote change, now and then, a panel change of
  the same point of the same unit within its least write interval.

Remote changes due at once (the thread behind: a loaded machine's round trips take tens
of milliseconds) are written together, after one read of the lock. A change due while the
thread is more than a second behind (the store is away, and an attempt waits its 2 s for an
answer) is skipped and counted, not made late.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import queue
import random
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from agent.controller import points as known_points
from agent.controller.interface import PointValue
from tests.soak.world import SET_POINT, VALUES_OF, device_id, point_key
from tests.support.paho_client import PahoStoreClient, Received

if TYPE_CHECKING:
    from tests.soak.world import World

LATE_S = 1.0
REPLY_S = 2.0  # a store that answers no request in this long is away for now
RECORD_LOOKBACK = 5000
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
        self.by_point: dict[str, dict[str, int]] = {
            point: defaultdict(int) for point in world.points
        }
        """Changes made of each point, remote and panel."""
        self.recent: dict[tuple[int, str], list[PointValue]] = defaultdict(list)
        self._decks: dict[tuple[str, int], list[str]] = defaultdict(list)
        self._client: PahoStoreClient | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._due: list[tuple[float, int, str, int, str]] = []
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

    def _at(self, when: float, kind: str, slot: int, point: str = SET_POINT) -> None:
        self._order += 1
        heapq.heappush(self._due, (when, self._order, kind, slot, point))

    def _panel_gap(self) -> float:
        return self.rng.expovariate(self.panel_per_unit_s * len(self.world.slots))

    def _run(self) -> None:
        while not self._stop.is_set() and self._due:
            when, _, kind, slot, point = heapq.heappop(self._due)
            wait = when - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                return
            late = time.monotonic() - when > LATE_S
            if kind == "remote":
                # Every other remote change due by now goes with this one: one read of the
                # lock and their writes in flight together, so that a thread behind (a
                # loaded machine, round trips of tens of milliseconds) catches up.
                slots = []
                for due, unit in [(when, slot), *self._due_remotes()]:
                    self._at(due + 1 / self.remote_per_unit_s, "remote", unit)
                    if time.monotonic() - due > LATE_S:
                        self.made["remote_skipped_late"] += 1
                    else:
                        slots.append(unit)
                if slots:
                    self.remotes(slots)
            elif kind == "panel":
                self._at(when + self._panel_gap(), "panel", 0)
                if late:
                    self.made["panel_skipped_late"] += 1
                else:
                    self.panel(self.rng.choice(self.world.slots), "panel")
            elif not late:  # a panel change within the unit's write wait
                self.panel(slot, "panel_in_write_wait", point)

    def _due_remotes(self) -> list[tuple[float, int]]:
        """The remote changes due by now, next in line (taken off the queue)."""
        now, taken = time.monotonic(), []
        while self._due and self._due[0][0] <= now and self._due[0][2] == "remote":
            when, _, _, slot, _ = heapq.heappop(self._due)
            taken.append((when, slot))
        return taken

    # ------------------------------------------------------------------ changes

    def value(
        self, slot: int, point: str, besides: tuple[PointValue | None, ...] = ()
    ) -> PointValue | None:
        """A value for a change of a point of `slot`: none of its last few, and none of
        `besides` (None: every value is one of those)."""
        values = VALUES_OF[point]
        recent = self.recent[(slot, point)]
        allowed = [
            v
            for v in values
            if not any(known_points.same(v, r) for r in recent)
            and not any(known_points.same(v, b) for b in besides)
        ]
        if not allowed:
            return None
        value = self.rng.choice(allowed)
        recent.append(value)
        # The last few, fewer for a point of few values: a choice of five keeps two.
        keep = max(0, min(8, len(values) - 3))
        del recent[: max(0, len(recent) - keep)]
        return value

    def panel(self, slot: int, kind: str, point: str | None = None) -> None:
        """Turns a knob of `slot` (of `point`, or of a point picked at random) to another
        value than it holds, and than the agent last synced for it or has written and not
        seen confirmed (its sync record's values): a knob turned to the value the unit holds
        changes nothing, one turned back to the last synced value cannot be told from no
        change by anyone who did not see the values in between (README, "A failover"), one
        turned to a write in doubt is taken for that write, and one turned to a value the
        point's key was given after the version the record has for it (a remote change, or a
        new active writing one back) is taken for a sync at that value by a standby that
        takes over (design.md, "A failover"). A point with no such value (a switch whose
        synced value is not the one it holds) is left for another."""
        unit = self.world.unit_at(slot)
        world = self.world
        order = [point] if point is not None else self._deal("panel", slot)
        turned: list[str] = []
        # The record as the agent last wrote it, by the store's own record of writes: a
        # store that restarted without its contents has none, but the agent remembers.
        recorded, since = self._since_record(slot)

        def turn() -> None:
            synced = _synced(recorded)
            for name, values in since.items():
                synced.setdefault(name, []).extend(values)
            if world.store_up:
                entry = world.store.store.entry(f"{device_id(slot)}\\synced".encode())
                for name, values in _synced(None if entry is None else entry.value).items():
                    synced.setdefault(name, []).extend(values)
            held = unit.core.point_values(time.monotonic())
            for name in order:
                value = self.value(slot, name, besides=(held[name], *synced.get(name, ())))
                if value is not None:
                    unit.panel_point(name, value)
                    turned.append(name)
                    return

        try:
            world.background.call(turn)
        except Exception:
            self.made[f"{kind}_failed"] += 1
            return
        if not turned:
            self.made[f"{kind}_no_value"] += 1
            return
        self.made[kind] += 1
        self.by_point[turned[0]]["panel"] += 1

    def _since_record(self, slot: int) -> tuple[bytes | None, dict[str, list[PointValue]]]:
        """The slot's sync record as an agent last wrote it, among the store's recent writes
        (the newest few thousand: seconds of a line of 32), and the values written to each
        of its points' keys at a newer version than the record's for that point: a standby
        takes a value it saw there, that the unit holds, for one the unit was synced at (a
        new active writes the record back unchanged, so its time says nothing)."""
        record = f"{device_id(slot)}\\synced".encode()
        keys = {point_key(slot, name).encode(): name for name in self.world.points}
        events = self.world.checker.store
        low = max(-1, len(events) - RECORD_LOOKBACK)
        raw: bytes | None = None
        for index in range(len(events) - 1, low, -1):
            event = events[index]
            if event.key == record and event.accepted and event.command == "SET":
                raw = event.value
                break
        synced_at = _versions(raw)
        since: dict[str, list[PointValue]] = defaultdict(list)
        for index in range(len(events) - 1, low, -1):
            event = events[index]
            name = keys.get(event.key)
            if name is None or not event.accepted or event.command != "SET":
                continue
            at, version = synced_at.get(name), _version(event.version)
            if at is not None and version is not None and version <= at:
                continue
            if event.value is not None:
                with contextlib.suppress(known_points.InvalidValue):
                    since[name].append(known_points.parse(known_points.point(name), event.value))
        return raw, since

    def remotes(self, slots: list[int]) -> None:
        """A remote change of each of `slots` (of its next point): written together, each
        fenced with the lock's version read just before; one refused for a lower version
        (the lock changed hands meanwhile) is tried once more with the lock read again."""
        changes: list[tuple[int, str, PointValue]] = []
        for slot in slots:
            point = self._deal("remote", slot)[0]
            value = self.value(slot, point)
            assert value is not None  # with nothing besides, a point has a value not recent
            changes.append((slot, point, value))
        outcomes = self._set(changes)
        again = [i for i, outcome in enumerate(outcomes) if outcome == "refused"]
        if again:
            self.made["remote_retried"] += len(again)
            for i, outcome in zip(again, self._set([changes[i] for i in again]), strict=True):
                outcomes[i] = outcome
        for (slot, point, _), outcome in zip(changes, outcomes, strict=True):
            self.made["remote" if outcome == "accepted" else f"remote_{outcome}"] += 1
            if outcome != "accepted":
                continue
            self.by_point[point]["remote"] += 1
            if self.rng.random() < self.panel_in_write_wait:
                delay = self.rng.uniform(0.02, max(0.03, self.world.min_write_interval_s))
                self._at(time.monotonic() + delay, "panel_in_write_wait", slot, point)

    def _deal(self, kind: str, slot: int) -> list[str]:
        """The unit's next point for a change of this kind, from a deck of the world's
        points shuffled anew when it runs out, then the others (to turn if it has no value
        to take)."""
        deck = self._decks[(kind, slot)]
        if not deck:
            deck.extend(self.rng.sample(self.world.points, len(self.world.points)))
        first = deck.pop()
        return [first, *(p for p in self.world.points if p != first)]

    def _set(self, changes: list[tuple[int, str, PointValue]]) -> list[str]:
        """Each change's outcome: accepted, refused, no_active (no lock to fence it with)
        or failed (no answer within REPLY_S of the first request: the store is away)."""
        deadline = time.monotonic() + REPLY_S
        try:
            client = self._connected()
            lock = self._reply(
                client.send("GET", self.world.lock_key, acknowledged=False), deadline
            )
            if lock is None:
                self._drop()
                return ["failed"] * len(changes)
            token = lock.prop("__ts")
            if lock.payload == NO_LOCK or token is None:
                return ["no_active"] * len(changes)
            waiters = [
                client.send(
                    "SET",
                    point_key(slot, point),
                    known_points.encode(known_points.point(point), value),
                    ft=token,
                    acknowledged=False,
                )
                for slot, point, value in changes
            ]
        except Exception:
            self._drop()
            return ["failed"] * len(changes)
        outcomes = []
        for waiter in waiters:
            reply = self._reply(waiter, deadline)
            outcomes.append(
                "failed" if reply is None else "accepted" if reply.payload == OK else "refused"
            )
        if "failed" in outcomes:
            self._drop()
        return outcomes

    @staticmethod
    def _reply(waiter: queue.Queue[Received], deadline: float) -> Received | None:
        try:
            return waiter.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None

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


def _synced(raw: bytes | None) -> dict[str, list[PointValue]]:
    """Each point's values in a sync record: the synced one and the writes pending (the set
    point's at its top, the others under "points")."""
    try:
        record = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    if not isinstance(record, dict):
        return {}
    found: dict[str, list[PointValue]] = {}
    entries: dict[str, object] = {SET_POINT: record}
    others = record.get("points")
    if isinstance(others, dict):
        entries.update(others)
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            continue
        pending = entry.get("pending")
        writes = [entry, *(pending if isinstance(pending, list) else [])]
        values = [w.get("value") for w in writes if isinstance(w, dict)]
        found[name] = [v for v in values if isinstance(v, str | bool | int | float)]
    return found


def _version(text: str | None) -> tuple[int, int] | None:
    """A store version (`wall:counter:node`) in the order the store gives them."""
    try:
        wall, counter, _ = (text or "").split(":", 2)
        return int(wall), int(counter)
    except ValueError:
        return None


def _versions(raw: bytes | None) -> dict[str, tuple[int, int]]:
    """The version each point was synced at, by a sync record."""
    try:
        record = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    if not isinstance(record, dict):
        return {}
    entries: dict[str, object] = {SET_POINT: record}
    others = record.get("points")
    if isinstance(others, dict):
        entries.update(others)
    found: dict[str, tuple[int, int]] = {}
    for name, entry in entries.items():
        if isinstance(entry, dict) and isinstance(entry.get("version"), str):
            version = _version(entry["version"])
            if version is not None:
                found[name] = version
    return found
