"""The bus schedule: which transaction goes on the line next. Pure: time is passed in.

One master, one transaction at a time. In order of precedence:

1. Urgent work (a remote change being applied: its read, its write), first come first
   served. A write to a device never follows its previous write sooner than the device's
   least write interval (its EEPROM), and a new write to a device replaces one still
   waiting: pending writes collapse to the latest.
2. Probes of quarantined devices, when due.
3. Routine polls, round the devices: a cycle reads every available device once, and a new
   cycle starts every poll interval, or at once when the line is slower than that.

A device that does not answer costs at most one reply timeout per cycle; after
`quarantine_after` timeouts in a row (or `quarantine_after_errors` garbled answers) it is
quarantined: left out of the cycles and probed, every `probe_initial_s` at first, backing
off to `probe_max_s`, until it answers well again. Urgent work for a quarantined device is
refused at once rather than spend a timeout on it.

After an urgent read, routine polls and probes wait up to `write_hold_s` for the write
that may follow it (a remote change is read, then written): a poll of another device in
between would age the reading past what a write may be decided on, and cost the write a
read of its own, two transactions in all. Urgent work never waits for it.

Urgent work goes first, but not always: after `URGENT_BEFORE_ROUTINE` urgent transactions
in a row, a due probe or poll takes a turn (never between an urgent read and its write), so
that under a sustained stream of remote changes panel changes are still seen and a unit
that came back is still found.

A slow device (its transactions take `SLOW_FACTOR` times a poll's line time or more,
answered or not: a unit that times out holds the line for its reply timeout and the wait for
its late reply) costs the others at most one of its transactions per change: no poll of it
starts that would still be on the line when a waiting write becomes due, and one that
answers slowly is polled less often (its polls take at most `SLOW_SHARE` of the line; one
that does not answer is quarantined after its timeouts in a row, then probed).
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent.controller.interface import PointValue

DEFAULT_QUARANTINE_AFTER = 2
DEFAULT_QUARANTINE_AFTER_ERRORS = 3
DEFAULT_PROBE_INITIAL_S = 30.0
DEFAULT_PROBE_MAX_S = 300.0
SLOW_FACTOR = 4.0
SLOW_SHARE = 0.1
"""A slow device's polls take at most this share of the line's time."""
URGENT_BEFORE_ROUTINE = 4
"""Urgent transactions in a row after which a due probe or poll takes a turn."""
SMOOTHING = 0.3
"""Weight of the newest duration in a device's running mean."""


class Kind(enum.Enum):
    READ = "read"  # the controller's state
    LIMITS = "limits"  # the set points it accepts
    WRITE = "write"  # a set point, read back
    POLL = "poll"  # a routine read (the schedule makes these itself)
    PROBE = "probe"  # a read of a quarantined device


class Outcome(enum.Enum):
    OK = "ok"
    TIMEOUT = "timeout"  # no answer: counts towards quarantine
    ERROR = "error"  # an answer, but a wrong one (checksum, nonsense): the device is there
    LINE_DOWN = "line down"  # the port itself failed: no device is to blame


@dataclass(frozen=True, slots=True, eq=False)
class Op:
    """One transaction to put on the line. Identity matters: each is its own request."""

    device: str
    kind: Kind
    value: PointValue | None = None
    expected: PointValue | None = None
    """For a write: the set point the unit held when it was decided. The bus reads the unit
    right before the write (unless its newest reading is fresh: taken after `fresh_after`,
    and by the transaction just before) and writes only if it still holds that: a panel
    change made since is not written over."""
    fresh_after: float = float("-inf")
    point: str = "setPoint"
    """For a write: which point (agent.controller.points)."""
    number: int = field(default_factory=itertools.count().__next__)


class Refused(Exception):
    """The schedule will not put this on the line (the device is quarantined)."""


@dataclass
class _Device:
    name: str
    min_write_interval_s: float
    last_write_at: float | None = None
    timeouts_in_a_row: int = 0
    errors_in_a_row: int = 0
    errors: int = 0
    """Garbled answers, all told."""
    quarantined: bool = False
    probe_at: float = 0.0
    probe_delay_s: float = 0.0
    took_s: float | None = None
    """Running mean of how long its answered transactions take."""
    next_poll_at: float = float("-inf")
    """A slow device is not polled before this."""


@dataclass(frozen=True, slots=True)
class Change:
    """A device left or rejoined the cycles."""

    device: str
    available: bool


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a finished transaction changed: a device left or rejoined the cycles, and the
    urgent work refused because its device was quarantined (to be failed by the caller)."""

    change: Change | None = None
    refused: tuple[Op, ...] = ()


class BusSchedule:
    def __init__(
        self,
        devices: Sequence[str],
        *,
        poll_interval_s: float,
        min_write_interval_s: Mapping[str, float] | float = 0.0,
        quarantine_after: int = DEFAULT_QUARANTINE_AFTER,
        quarantine_after_errors: int = DEFAULT_QUARANTINE_AFTER_ERRORS,
        probe_initial_s: float = DEFAULT_PROBE_INITIAL_S,
        probe_max_s: float = DEFAULT_PROBE_MAX_S,
        poll_s: float = 0.0,
        write_hold_s: float = 0.0,
        now: float = 0.0,
    ) -> None:
        """`poll_s`: a poll's line time, what a device that answers at once costs (0: no
        device is ever slow). `write_hold_s`: how long routine work waits after an urgent
        read for the write that may follow it (0: not at all)."""
        if len(set(devices)) != len(devices):
            raise ValueError("device names must be unique")
        if poll_interval_s <= 0 or quarantine_after < 1 or quarantine_after_errors < 1:
            raise ValueError("need a positive poll interval and quarantine_after >= 1")
        if not 0 < probe_initial_s <= probe_max_s:
            raise ValueError("need 0 < probe_initial_s <= probe_max_s")
        if write_hold_s < 0:
            raise ValueError("write_hold_s must not be negative")
        intervals = (
            min_write_interval_s
            if isinstance(min_write_interval_s, Mapping)
            else dict.fromkeys(devices, min_write_interval_s)
        )
        self._devices = {name: _Device(name, intervals.get(name, 0.0)) for name in devices}
        self._order = list(devices)
        self.poll_interval_s = poll_interval_s
        self.quarantine_after = quarantine_after
        self.quarantine_after_errors = quarantine_after_errors
        self.poll_s = poll_s
        self.probe_initial_s = probe_initial_s
        self.probe_max_s = probe_max_s
        self.write_hold_s = write_hold_s
        self._held_until = float("-inf")
        """Routine work waits until then (an urgent read's write may follow)."""
        self._urgent: deque[Op] = deque()
        self._cycle: deque[str] = deque()
        self._cycle_due_at = now
        self._cycle_started_at: float | None = None
        self.last_cycle_s: float | None = None
        """How long the last complete poll cycle took, start to end."""
        self.cycles = 0
        self._urgent_in_a_row = 0

    # ------------------------------------------------------------------ queries

    @property
    def devices(self) -> list[str]:
        return list(self._order)

    def quarantined(self, device: str) -> bool:
        known = self._devices.get(device)  # (one joining or leaving at a reload: not)
        return known is not None and known.quarantined

    def pending(self) -> list[Op]:
        return list(self._urgent)

    def waiting(self) -> dict[str, int]:
        """What waits, by kind: the urgent work, and the routine polls left in this cycle."""
        counts = {kind.value: 0 for kind in Kind}
        for op in list(self._urgent):
            counts[op.kind.value] += 1
        counts[Kind.POLL.value] += len(self._cycle)
        return counts

    def slow(self, device: str) -> float | None:
        """How long the device's transactions take, if it is slow; None if not."""
        known = self._devices.get(device)
        took = None if known is None else known.took_s
        return took if self._is_slow(took) else None

    def errors(self, device: str) -> int:
        """Garbled answers the device gave, all told."""
        known = self._devices.get(device)
        return 0 if known is None else known.errors

    def _is_slow(self, took: float | None) -> bool:
        return self.poll_s > 0 and took is not None and took >= SLOW_FACTOR * self.poll_s

    # ------------------------------------------------------------------ requests

    def submit(self, op: Op) -> Op | None:
        """Queue urgent work; returns the write it replaces, if any (now superseded).

        Raises Refused for a quarantined device, KeyError for an unknown one.
        """
        device = self._devices[op.device]
        if op.kind in (Kind.POLL, Kind.PROBE):
            raise ValueError("polls and probes are the schedule's own")
        if device.quarantined:
            raise Refused(f"{op.device} is quarantined (not answering)")
        if op.kind is Kind.WRITE:
            for index, queued in enumerate(self._urgent):
                same_point = queued.device == op.device and queued.point == op.point
                if same_point and queued.kind is Kind.WRITE:
                    self._urgent[index] = op  # the latest takes the earlier one's turn
                    return queued
        self._urgent.append(op)
        return None

    def add(self, name: str, min_write_interval_s: float = 0.0) -> None:
        """A device joins the line (a reload): polled from the next cycle on."""
        if name in self._devices:
            raise ValueError(f"device {name} is on the line already")
        self._devices[name] = _Device(name, min_write_interval_s)
        self._order.append(name)

    def remove(self, name: str) -> tuple[Op, ...]:
        """A device leaves the line (a reload); returns its urgent work not started (to
        be failed by the caller). A transaction with it still on the line ends as any."""
        self._devices.pop(name, None)
        if name in self._order:
            self._order.remove(name)
        self._cycle = deque(queued for queued in self._cycle if queued != name)
        dropped = tuple(op for op in self._urgent if op.device == name)
        self._urgent = deque(op for op in self._urgent if op.device != name)
        return dropped

    def retry_first(self, op: Op) -> None:
        """Urgent work that could not go out yet (the lease did not cover it): first again."""
        self._urgent.appendleft(op)

    def withdraw(self, op: Op) -> bool:
        """Removes urgent work not started yet (its caller gave up)."""
        try:
            self._urgent.remove(op)
        except ValueError:
            return False
        return True

    def next(self, now: float) -> Op | float:
        """The transaction to start now, or the time to look again (new work wakes too)."""
        if self._urgent_in_a_row >= URGENT_BEFORE_ROUTINE and now >= self._held_until:
            turn = self._routine(now, float("inf"))
            if isinstance(turn, Op):
                self._urgent_in_a_row = 0
                return turn
        wake = float("inf")
        for op in self._urgent:
            if op.kind is Kind.WRITE:
                ready_at = self._write_ready_at(op.device)
                if ready_at > now:
                    wake = min(wake, ready_at)
                    continue
            self._urgent.remove(op)
            self._urgent_in_a_row += 1
            return op
        self._urgent_in_a_row = 0
        if now < self._held_until:
            return min(wake, self._held_until)
        return self._routine(now, wake)

    def _routine(self, now: float, wake: float) -> Op | float:
        """A due probe or poll; else the time to look again, at the latest `wake` (a poll
        that would still be on the line then does not start)."""
        for device in self._devices.values():
            if device.quarantined:
                if device.probe_at <= now:
                    return Op(device.name, Kind.PROBE)
                wake = min(wake, device.probe_at)
        if not self._cycle and now >= self._cycle_due_at:
            self._start_cycle(now)
        while self._cycle:
            name = self._cycle[0]
            device = self._devices[name]
            if device.quarantined or (self._is_slow(device.took_s) and device.next_poll_at > now):
                self._cycle.popleft()  # left out of this cycle
                continue
            # No poll that would still be on the line when a waiting write is due.
            if now + (device.took_s or self.poll_s) > wake:
                return wake
            self._cycle.popleft()
            return Op(name, Kind.POLL)
        self._end_cycle(now)
        return min(wake, self._cycle_due_at)

    def finished(
        self, op: Op, outcome: Outcome, now: float, took_s: float | None = None
    ) -> Verdict:
        """Records how a transaction ended (`took_s`: how long it held the line)."""
        device = self._devices.get(op.device)
        if device is None:
            return Verdict()  # removed while it was on the line
        if op.kind is Kind.WRITE and outcome is not Outcome.LINE_DOWN:
            device.last_write_at = now  # it may have reached the device even so
        if op.kind in (Kind.READ, Kind.LIMITS) and outcome is Outcome.OK:
            self._held_until = now + self.write_hold_s
        elif op.kind is Kind.WRITE:
            self._held_until = float("-inf")
        if outcome is Outcome.LINE_DOWN:
            return Verdict()
        if took_s is not None and op.kind is not Kind.WRITE:
            # What its transactions cost the line, answered or not (a write's includes
            # its read-back).
            device.took_s = (
                took_s
                if device.took_s is None
                else SMOOTHING * took_s + (1 - SMOOTHING) * device.took_s
            )
            if op.kind is Kind.POLL and outcome is Outcome.OK and self._is_slow(device.took_s):
                # Its polls take at most SLOW_SHARE of the line. (One that does not answer is
                # not spaced out so: its timeouts in a row quarantine it first.)
                device.next_poll_at = now + max(self.poll_interval_s, device.took_s / SLOW_SHARE)
        if outcome is Outcome.ERROR:
            device.errors += 1
            device.errors_in_a_row += 1
            if device.quarantined:
                return self._probe_failed(device, now)
            if device.errors_in_a_row < self.quarantine_after_errors:
                return Verdict()
            return self._quarantine(device, op, now)
        device.errors_in_a_row = 0
        if outcome is Outcome.TIMEOUT:
            device.timeouts_in_a_row += 1
            if device.quarantined:
                return self._probe_failed(device, now)
            if device.timeouts_in_a_row < self.quarantine_after:
                return Verdict()
            return self._quarantine(device, op, now)
        device.timeouts_in_a_row = 0
        if device.quarantined:
            device.quarantined = False
            return Verdict(Change(op.device, available=True))
        return Verdict()

    def rejoin_all(self, now: float) -> list[Change]:
        """The line came back (reopened): everyone is given a fresh chance at once."""
        changes = []
        for device in self._devices.values():
            device.timeouts_in_a_row = 0
            device.errors_in_a_row = 0
            if device.quarantined:
                device.quarantined = False
                changes.append(Change(device.name, available=True))
        self._cycle.clear()
        self._cycle_due_at = now
        return changes

    # ------------------------------------------------------------------ internals

    def _probe_failed(self, device: _Device, now: float) -> Verdict:
        device.probe_delay_s = min(device.probe_delay_s * 2, self.probe_max_s)
        device.probe_at = now + device.probe_delay_s
        return Verdict()

    def _quarantine(self, device: _Device, op: Op, now: float) -> Verdict:
        device.quarantined = True
        device.probe_delay_s = self.probe_initial_s
        device.probe_at = now + self.probe_initial_s
        refused = tuple(queued for queued in self._urgent if queued.device == op.device)
        self._urgent = deque(queued for queued in self._urgent if queued.device != op.device)
        return Verdict(Change(op.device, available=False), refused)

    def _write_ready_at(self, name: str) -> float:
        device = self._devices[name]
        if device.last_write_at is None:
            return float("-inf")
        return device.last_write_at + device.min_write_interval_s

    def _start_cycle(self, now: float) -> None:
        self._cycle.extend(self._order)
        self._cycle_started_at = now
        # The next cycle is due one interval after this one started (the interval is the
        # least time between two polls of a unit: a cycle that started late is no debt to
        # catch up on with cycles back to back); if the line is slower than that, the next
        # starts as soon as this one ends.
        self._cycle_due_at = now + self.poll_interval_s

    def _end_cycle(self, now: float) -> None:
        if self._cycle_started_at is not None:
            self.last_cycle_s = now - self._cycle_started_at
            self.cycles += 1
            self._cycle_started_at = None
