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
   version the store gave another holder before it.
3. No lost change: a panel change is never written over at the controller before it was
   published; an agent publishes only what a panel change made (the newest, or one turned
   over again at the panel before its publish landed; or a value the store lost, again);
   a remote change the store accepted ends up at the controller unless a later
   change took its place; and when the faults stop, every controller and its key agree.
4. Every byte on the wire within a lease: every request an instance put on the line (from
   when it reached the line, a request that waited for the medium included, to its last
   byte) lies within a lease of the line's lock that the store granted that instance (from
   the grant to its expiry, renewals extending it, a release ending it), by the store's own
   record, not the agents' logs.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

AGENT_PREFIX = "agent-"
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


@dataclass(frozen=True, slots=True)
class UnitEvent:
    at: float
    address: int
    kind: str  # "panel" | "write"
    value: float


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
    violations: list[Violation] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """What each check looked at, for the summary."""
    lost: int = 0
    raced: int = 0
    """Panel changes made between an agent's read and its write of the same unit."""

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
        holders: list[tuple[str, str]] = []  # (version, holder) of every lock grant, in order
        holder_of: dict[str, str] = {}
        for event in self.store:
            if event.key == self.lock_key:
                if event.command == "SET" and event.accepted and event.version is not None:
                    holder = (event.value or b"").decode(errors="replace")
                    holders.append((event.version, holder))
                    holder_of[event.version] = holder
                continue
            if not event.client.startswith(AGENT_PREFIX) or not event.accepted:
                continue
            if event.command not in ("SET", "DEL", "VDEL") or event.token is None:
                continue
            own = holder_of.get(event.token)
            newer = [h for version, h in holders if _newer(version, event.token) and h != own]
            if newer:
                self._violate(
                    "stale token",
                    event.at,
                    f"{event.client} wrote {event.key!r} with {event.token} after {newer[0]} "
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
        self, final_units: dict[int, float], final_store: dict[int, bytes | None]
    ) -> None:
        by_device: dict[int, list[tuple[float, str, Any]]] = defaultdict(list)
        for unit_event in self.units:
            by_device[unit_event.address].append((unit_event.at, unit_event.kind, unit_event.value))
        keys = {
            f"{device}\\setPoint".encode(): address for address, device in self.device_of.items()
        }
        for event in self.store:
            address = keys.get(event.key)
            if address is None or not event.accepted or event.command != "SET":
                continue
            kind = "publish" if event.client.startswith(AGENT_PREFIX) else "remote"
            by_device[address].append((event.at, kind, _number(event.value)))
        for wiped in self.wiped_at:
            for address in self.device_of:
                by_device[address].append((wiped, "wipe", None))
        for line_event in self.line:
            if line_event.address is not None and line_event.kind in READS:
                by_device[line_event.address].append((line_event.at, "read", None))
        for address, events in by_device.items():
            events.sort(key=lambda e: e[0])
            self._check_device(address, events)
        for address in self.device_of:
            stored = _number(final_store.get(address))
            unit = final_units.get(address)
            if stored is None or unit is None or abs(stored - unit) > 1e-6:
                self.lost += 1
                self._violate(
                    "no agreement",
                    0.0,
                    f"{self.device_of[address]}: controller {unit}, store {stored} at the end",
                )

    def _check_device(self, address: int, events: list[tuple[float, str, Any]]) -> None:
        device = self.device_of[address]
        unpublished: tuple[float, float] | None = None  # a panel change not yet in the store
        # Panel changes turned over at the panel by a later one before they were published:
        # an agent that read one may still publish it (then the later one after it).
        superseded: list[float] = []
        controller: float | None = None
        store_holds: float | None = None
        pending_remote: tuple[float, float] | None = None  # accepted, not applied yet
        last_read = float("-inf")
        for at, kind, value in events:
            if kind == "read":
                last_read = at
            elif kind == "panel":
                if unpublished is not None:
                    superseded.append(unpublished[1])
                unpublished = (at, value)
                controller = value
            elif kind == "write":
                if unpublished is not None and abs(value - unpublished[1]) > 1e-6:
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
                if pending_remote is not None and abs(value - pending_remote[1]) < 1e-6:
                    pending_remote = None
            elif kind == "publish":
                if store_holds is not None and abs(value - store_holds) < 1e-6:
                    # The value the store holds, written back (a new active fencing the key
                    # with its token): nothing changes, a pending remote change stays pending.
                    continue
                earlier = [i for i, v in enumerate(superseded) if abs(value - v) < 1e-6]
                explained = (
                    (unpublished is not None and abs(value - unpublished[1]) < 1e-6)
                    or bool(earlier)
                    or store_holds is None  # the store had lost it: published again
                    or (
                        controller is not None
                        and abs(value - controller) < 1e-6
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
                if unpublished is not None and abs(value - unpublished[1]) < 1e-6:
                    unpublished = None
                    superseded.clear()
                elif earlier:
                    del superseded[: earlier[-1] + 1]
                store_holds = value
                pending_remote = None  # a later store change takes the remote's place
            elif kind == "remote":
                store_holds = value
                pending_remote = (at, value)
                if (
                    controller is not None
                    and abs(value - controller) < 1e-6
                    and unpublished is None
                ):
                    pending_remote = None
            elif kind == "wipe":
                store_holds = None

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


def _newer(version: str, than: str) -> bool:
    return _hlc_key(version) > _hlc_key(than)


def _hlc_key(text: str) -> tuple[int, int, str]:
    wall, counter, node = text.split(":", 2)
    return int(wall), int(counter), node


def _number(value: bytes | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None
