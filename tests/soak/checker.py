"""The soak's independent checker: the pair's invariants, from what the fake line and the
store saw, never from what the agents say about themselves.

Fed with:
- the fake line's records (every request on the device line: when it reached the line,
  when its first and last byte were on it, on which connection, of which instance: each
  instance reaches the line through a port of its own), and each unit's writes and panel
  changes (when, what value);
- the store's own record of every request it handled (a hook on the pure store: client,
  command, key, value, fencing token, expiry, whether it was accepted, and the version it
  gave).

Checks:
1. One master on the line: no two connections drive it at once (their spans of requests
   never overlap, and the fake saw no collision).
2. The newest token: no write an agent got accepted carries a token older than a lock
   version the store gave another holder before it, the line's history included (the
   agents record nothing after their lease). A history key may be named to check it by a
   looser rule (no record older than one before it), for agents that recorded their
   step-down with the lease just lost.
3. No lost change, point by point (the set point, and on a whole thermostat each point the
   agent writes, in its own key): a panel change is never written over at the controller
   before it was published; an agent publishes only what a panel change made (the newest,
   or one turned over again at the panel before its publish landed; or a value the store
   lost, again); a remote change the store accepted ends up at the controller unless a
   later change took its place (a publish to a key the store no longer had, refused
   because a remote change re-created it first, gives way to that change); and when the
   faults stop, every point of every controller and its key agree.
4. Every byte on the wire within a lease: every request an instance put on the line (from
   when it reached the line, a request that waited for the medium included, to its last
   byte) lies within a lease of the line's lock that the store granted that instance (from
   the grant to its expiry, renewals extending it, a release ending it), by the store's own
   record, not the agents' logs.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from agent.controller import points as known_points
from agent.controller.interface import PointValue
from agent.controller.points import InvalidValue

AGENT_PREFIX = "agent-"
SET_POINT = "setPoint"
READS = frozenset({"GET STATE", "GET SP", "GET POINTS", "READ HOLDING", "READ INPUT"})
WRITES = frozenset({"SET SP", "WRITE", "WRITE MULTIPLE"})
"""Writes on the wire; a profile's other points are written with `SET <name>` too."""


@dataclass(frozen=True, slots=True)
class StoreEvent:
    at: float
    client: str
    command: str
    key: bytes
    value: bytes | None
    token: str | None
    accepted: bool
    version: str | None
    expiry_ms: int | None = None
    """The write's PX: the key expires that long after `at`."""


@dataclass(frozen=True, slots=True)
class LineEvent:
    at: float
    """When the request's first byte was on the line."""
    client: str
    address: int | None
    kind: str
    value: float | None
    collision: bool
    ended: float | None = None
    """When the request's last byte was on the line (None: at `at`). The unit's reply is
    the unit's: a late one is a unit fault, not a second master."""
    instance: str | None = None
    """The instance whose port it came on (None: not known)."""
    sent: float | None = None
    """When the instance's first byte reached the line, if it then waited for the medium
    (None: at `at`)."""
    points: tuple[str, ...] | None = None
    """The points a read fetched (None: every point of the unit: GET POINTS, or a read of
    every register)."""


@dataclass(frozen=True, slots=True)
class UnitEvent:
    at: float
    address: int
    kind: str  # "panel" | "write"
    value: PointValue
    point: str = SET_POINT


@dataclass
class Violation:
    kind: str
    at: float
    detail: str


@dataclass
class Checker:
    device_of: dict[int, str]  # address -> device id
    lock_key: bytes
    store: list[StoreEvent] = field(default_factory=list)
    line: list[LineEvent] = field(default_factory=list)
    units: list[UnitEvent] = field(default_factory=list)
    wiped_at: list[float] = field(default_factory=list)
    """When the store forgot its contents."""
    rolled_back: list[tuple[float, dict[bytes, tuple[bytes | None, list[bytes]]]]] = field(
        default_factory=list
    )
    """When the store went back in time (it lost its last writes, acknowledged ones among
    them): by key, what it held after (None: nothing) and the values it lost."""
    violations: list[Violation] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """What each check looked at, for the summary."""
    lost: int = 0
    raced: int = 0
    """Panel changes made between an agent's read and its write of the same unit."""
    points: tuple[str, ...] = (SET_POINT,)
    """The points of every unit whose changes are checked, each in its key
    `<device>\\<point>`."""
    history_key: bytes | None = None
    """The line's history (`<line>\\history`): the pair's events as the operator reads them,
    not a device's state. An instance records its step-down there fenced with the lease it
    has just lost (after another may have been granted the lock), so the key has a rule of
    its own: no record carries an older token than one the store accepted there before it."""

    # ------------------------------------------------------------------ 1. one master

    def check_one_master(self) -> None:
        spans: dict[str, list[float]] = {}
        for event in self.line:
            span = spans.setdefault(event.client, [event.at, event.at])
            span[1] = max(span[1], event.at)
            if event.collision:
                self._violate("two masters", event.at, f"{event.client} collided on the line")
        ordered = sorted(spans.items(), key=lambda item: item[1][0])
        for (first, (_, first_end)), (second, (second_start, _)) in itertools.pairwise(ordered):
            if second_start < first_end:
                self._violate(
                    "two masters",
                    second_start,
                    f"{second} drove the line from {second_start:.3f} while {first} did "
                    f"until {first_end:.3f}",
                )

    # ------------------------------------------------------------------ 2. newest token

    def check_tokens(self) -> None:
        grants = _Grants()
        holder_of: dict[str, str] = {}
        wipes = sorted(self.wiped_at)
        newest_record: str | None = None  # the newest token of a history record kept
        for event in self.store:
            while wipes and wipes[0] <= event.at:
                wipes.pop(0)
                newest_record = None  # the store forgot the history and its fence
            if event.key == self.history_key:
                if not event.client.startswith(AGENT_PREFIX) or not event.accepted:
                    continue
                if event.command != "SET" or event.token is None:
                    continue
                self.checked["history records"] += 1
                if newest_record is not None and _newer(newest_record, event.token):
                    self._violate(
                        "stale history record",
                        event.at,
                        f"{event.client} recorded the history with {event.token} after a "
                        f"record with {newest_record}",
                    )
                else:
                    newest_record = event.token
                continue
            if event.key == self.lock_key:
                if event.command == "SET" and event.accepted and event.version is not None:
                    holder = (event.value or b"").decode(errors="replace")
                    grants.add(event.version, holder)
                    holder_of[event.version] = holder
                continue
            if not event.client.startswith(AGENT_PREFIX) or not event.accepted:
                continue
            if event.command not in ("SET", "DEL", "VDEL") or event.token is None:
                continue
            newer = grants.first_newer_other(event.token, holder_of.get(event.token))
            if newer is not None:
                self._violate(
                    "stale token",
                    event.at,
                    f"{event.client} wrote {event.key!r} with {event.token} after {newer} "
                    "held the lock",
                )

    # ------------------------------------------------------------------ 4. within a lease

    def leases(self) -> dict[str, list[tuple[float, float]]]:
        """Each instance's leases of the lock, as the store granted them: (from, until)."""
        leases: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for event in self.store:
            if event.key != self.lock_key or not event.accepted:
                continue
            if event.command == "SET" and event.value is not None and event.expiry_ms:
                holder = event.value.split(b"#")[0].decode(errors="replace")
                until = event.at + event.expiry_ms / 1000
                spans = leases[holder]
                if spans and spans[-1][0] <= event.at <= spans[-1][1]:
                    spans[-1] = (spans[-1][0], max(spans[-1][1], until))  # a renewal
                else:
                    spans.append((event.at, until))
            elif event.command in ("DEL", "VDEL"):
                for spans in leases.values():
                    if spans and spans[-1][0] <= event.at < spans[-1][1]:
                        spans[-1] = (spans[-1][0], event.at)  # released
        return leases

    def check_wire(self) -> None:
        leases = self.leases()
        for event in self.line:
            if event.instance is None:
                continue
            first = event.at if event.sent is None else min(event.sent, event.at)
            ended = event.at if event.ended is None else event.ended
            self.checked["transactions on the wire"] += 1
            if event.kind in WRITES or event.kind.startswith("SET "):
                self.checked["writes on the wire"] += 1
            if any(start <= first and ended <= end for start, end in leases[event.instance]):
                continue
            nearest = min(
                leases[event.instance] or [(float("nan"), float("nan"))],
                key=lambda span: abs(span[1] - event.at),
            )
            self._violate(
                "outside the lease",
                event.at,
                f"{event.instance} put {event.kind} (unit {event.address}) on the line from "
                f"{first:.3f} to {ended:.3f}; its nearest lease ran {nearest[0]:.3f} to "
                f"{nearest[1]:.3f}",
            )
        self.checked["leases granted"] = sum(len(spans) for spans in leases.values())

    # ------------------------------------------------------------------ 3. no lost change

    def check_changes(
        self,
        final_units: dict[Any, PointValue],
        final_store: dict[Any, bytes | None],
    ) -> None:
        """`final_units`, `final_store`: what every unit and key held once the faults
        stopped, by (address, point) (an address alone: its set point)."""
        by_point: dict[tuple[int, str], list[tuple[float, str, Any]]] = defaultdict(list)
        for unit_event in self.units:
            by_point[(unit_event.address, unit_event.point)].append(
                (unit_event.at, unit_event.kind, unit_event.value)
            )
        keys = {
            f"{device}\\{point}".encode(): (address, point)
            for address, device in self.device_of.items()
            for point in self.points
        }
        for event in self.store:
            found = keys.get(event.key)
            if found is None or event.command != "SET":
                continue
            agent = event.client.startswith(AGENT_PREFIX)
            if event.accepted:
                kind = "publish" if agent else "remote"
            elif agent:
                kind = "refused"  # a publish the store turned down
            else:
                continue
            by_point[found].append((event.at, kind, _parse(found[1], event.value)))
        for wiped in self.wiped_at:
            for address in self.device_of:
                for point in self.points:
                    by_point[(address, point)].append((wiped, "wipe", None))
        for rolled_at, rolled in self.rolled_back:
            for key, (held, lost) in rolled.items():
                found = keys.get(key)
                if found is not None:
                    parsed = [_parse(found[1], value) for value in lost]
                    by_point[found].append(
                        (rolled_at, "rollback", (_parse(found[1], held), parsed))
                    )
        for line_event in self.line:
            if line_event.address is not None and line_event.kind in READS:
                for point in line_event.points or self.points:
                    by_point[(line_event.address, point)].append((line_event.at, "read", None))
        for (address, point), events in by_point.items():
            if address not in self.device_of or point not in self.points:
                continue
            events.sort(key=lambda e: e[0])
            self.checked[f"changes of {point}"] += sum(
                kind in ("panel", "remote") for _, kind, _ in events
            )
            self._check_point(address, point, events)
        units = {_keyed(key): value for key, value in final_units.items()}
        store = {_keyed(key): value for key, value in final_store.items()}
        for address in self.device_of:
            for point in self.points:
                stored = _parse(point, store.get((address, point)))
                unit = units.get((address, point))
                if stored is None or unit is None or not _same(stored, unit):
                    self.lost += 1
                    self._violate(
                        "no agreement",
                        0.0,
                        f"{self._name(address, point)}: controller {unit}, store {stored} at "
                        "the end",
                    )

    def _name(self, address: int, point: str) -> str:
        """A unit's point as the violations name it: `s03` (its set point), `s03 mode`."""
        device = self.device_of[address]
        return device if point == SET_POINT else f"{device} {point}"

    def _check_point(self, address: int, point: str, events: list[tuple[float, str, Any]]) -> None:
        device = self._name(address, point)
        unpublished: tuple[float, Any] | None = None  # a panel change not yet in the store
        # Panel changes turned over at the panel by a later one before they were published
        # (an agent that read one may still publish it, then the later one after it), or
        # made to the value the store held (published if a remote change crosses them).
        superseded: list[Any] = []
        controller: Any = None
        store_holds: Any = None
        pending_remote: tuple[float, Any] | None = None  # accepted, not applied yet
        # No agent's write of the key accepted since the store had none (at the start, or
        # once it forgot its contents): an agent publishes to it only if it is still empty.
        empty_since = True
        last_read = float("-inf")
        lost_by_store: list[Any] = []  # values the store lost when it went back in time
        # What the unit held, synced, when the store went back to an older value, and that
        # older value: until the store changes again, never written over the synced one.
        stale: tuple[Any, Any] | None = None
        # The last remote change accepted while the unit held another value, until the
        # unit is written or turned: a store that goes back to it holds a change the unit
        # never took, which is applied (a later one it lost is the store's loss).
        untaken_remote: Any = None
        for at, kind, value in events:
            if kind == "read":
                last_read = at
            elif kind == "panel":
                untaken_remote = None
                if unpublished is not None:
                    superseded.append(unpublished[1])
                unpublished = (at, value)
                controller = value
                if pending_remote is not None and _same(value, pending_remote[1]):
                    pending_remote = None  # the unit holds the remote change's value now
            elif kind == "write":
                if stale is not None and _same(value, stale[1]) and _same(controller, stale[0]):
                    self.lost += 1
                    self._violate(
                        "synced change lost",
                        at,
                        f"{device}: {value}, which the store went back to, written over the "
                        f"synced {controller}",
                    )
                stale = None
                untaken_remote = None
                if unpublished is not None and not _same(value, unpublished[1]):
                    if unpublished[0] < last_read:
                        self.lost += 1
                        self._violate(
                            "panel change lost",
                            at,
                            f"{device}: {value} written over {unpublished[1]} (made at "
                            f"{unpublished[0]:.3f}, read since) before it was published",
                        )
                    else:
                        # Turned between the agent's read and its write: no master without
                        # a compare-and-set on the device can see that. Counted apart.
                        self.raced += 1
                    unpublished = None
                superseded.clear()
                controller = value
                if pending_remote is not None and _same(value, pending_remote[1]):
                    pending_remote = None
            elif kind == "refused":
                if (
                    empty_since
                    and store_holds is not None
                    and unpublished is not None
                    and _same(value, unpublished[1])
                ):
                    # The panel change, published only if the key was still empty, lost
                    # the race to a remote change written meanwhile, which is applied
                    # instead (design.md, "A publish to an empty store is SET NX"). A
                    # panel change made after that reading is still to be published.
                    self.checked["publishes that lost the race to a remote change"] += 1
                    superseded.append(unpublished[1])
                    unpublished = None
            elif kind == "publish":
                empty_since = False
                if store_holds is not None and _same(value, store_holds):
                    # The value the store holds, written back (a new active fencing the key
                    # with its token): nothing changes, a pending remote change stays pending.
                    continue
                stale = None
                earlier = [i for i, v in enumerate(superseded) if _same(value, v)]
                explained = (
                    (unpublished is not None and _same(value, unpublished[1]))
                    or bool(earlier)
                    or any(_same(value, v) for v in lost_by_store)  # given back to the store
                    or store_holds is None  # the store had lost it: published again
                    or (
                        controller is not None
                        and _same(value, controller)
                        and pending_remote is None
                    )
                )
                if not explained:
                    self.lost += 1
                    self._violate(
                        "stale value published",
                        at,
                        f"{device}: published {value}, which no panel change made "
                        f"(controller {controller}, remote pending {pending_remote})",
                    )
                if unpublished is not None and _same(value, unpublished[1]):
                    unpublished = None
                    superseded.clear()
                elif earlier:
                    del superseded[: earlier[-1] + 1]
                store_holds = value
                pending_remote = None  # a later store change takes the remote's place
            elif kind == "remote":
                stale = None
                store_holds = value
                pending_remote = (at, value)
                if controller is not None and _same(value, controller) and unpublished is None:
                    pending_remote = None
                elif controller is not None and not _same(value, controller):
                    untaken_remote = value
            elif kind == "wipe":
                store_holds = None
                empty_since = True
            elif kind == "rollback":
                # The store lost its last writes of the key. A remote change among them was
                # lost by the store, not by the agent; a value the unit holds and the store
                # held (synced) must be published again before anything is written over it.
                held, lost = value
                if untaken_remote is not None and _same(held, untaken_remote):
                    pending_remote = (at, held)  # back to a remote change still to apply
                elif (
                    store_holds is not None
                    and controller is not None
                    and _same(controller, store_holds)
                    and not _same(held, store_holds)
                ):
                    stale = (controller, held)
                if pending_remote is not None and not _same(held, pending_remote[1]):
                    pending_remote = None
                lost_by_store = [v for v in lost if v is not None]
                store_holds = held
                if held is None:
                    empty_since = True
            if (
                unpublished is not None
                and store_holds is not None
                and _same(unpublished[1], store_holds)
            ):
                # The store holds the panel change's value (a remote change of the same
                # value, before or after it): the two agree, nothing is left to publish, and
                # a later write over it loses nothing. But a remote change of another value
                # before the agent noticed it crosses it (design.md, "Crossing changes"):
                # the agent may then publish it, until it writes the unit.
                superseded.append(unpublished[1])
                unpublished = None

    # ------------------------------------------------------------------ helpers

    def _violate(self, kind: str, at: float, detail: str) -> None:
        self.violations.append(Violation(kind, at, detail))

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = defaultdict(int)
        for violation in self.violations:
            kinds[violation.kind] += 1
        return {
            "violations": len(self.violations),
            "violations_by_kind": dict(kinds),
            "lost": self.lost,
            "raced_panel_changes": self.raced,
            "checked": dict(self.checked),
            "first_violations": [
                f"{v.kind} at {v.at:.3f}: {v.detail}" for v in self.violations[:10]
            ],
        }


class _Grants:
    """Every grant and renewal of the lock so far, in the store's order, with the first one
    newer than a token held by another holder found by bisection: a soak of 30 minutes at
    TTL 1 s holds thousands of renewals and tens of thousands of fenced writes, and a scan of
    every grant for every write took longer than the soak itself."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, int, str]] = []
        self.run_of: list[int] = []
        """For each grant, its run: consecutive grants to one holder (its renewals)."""
        self.runs: list[str] = []
        self.holders: list[tuple[str, str]] = []
        self.ordered = True
        """The versions came in increasing order (else: a plain scan)."""

    def add(self, version: str, holder: str) -> None:
        key = _hlc_key(version)
        if self.keys and key < self.keys[-1]:
            self.ordered = False
        self.keys.append(key)
        self.holders.append((version, holder))
        if not self.runs or self.runs[-1] != holder:
            self.runs.append(holder)
        self.run_of.append(len(self.runs) - 1)

    def first_newer_other(self, token: str, own: str | None) -> str | None:
        """The holder of the first grant newer than `token` that is not `own`, if any."""
        if not self.ordered:
            newer = [h for version, h in self.holders if _newer(version, token) and h != own]
            return newer[0] if newer else None
        index = bisect.bisect_right(self.keys, _hlc_key(token))
        if index == len(self.keys):
            return None
        run = self.run_of[index]
        if self.runs[run] != own:
            return self.runs[run]
        # Consecutive runs have different holders: the next one is not `own`.
        return self.runs[run + 1] if run + 1 < len(self.runs) else None


def _newer(version: str, than: str) -> bool:
    return _hlc_key(version) > _hlc_key(than)


def _hlc_key(text: str) -> tuple[int, int, str]:
    wall, counter, node = text.split(":", 2)
    return int(wall), int(counter), node


def _keyed(key: Any) -> tuple[int, str]:
    """(address, point) for a key given as such, or as an address alone (its set point)."""
    return key if isinstance(key, tuple) else (key, SET_POINT)


def _parse(point: str, value: bytes | None) -> PointValue | None:
    """A point's value from its text in the store (None: absent, or not a value of it)."""
    if value is None:
        return None
    try:
        return known_points.parse(known_points.point(point), value)
    except InvalidValue:
        return None


def _same(a: Any, b: Any) -> bool:
    return known_points.same(a, b)
