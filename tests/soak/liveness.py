"""Liveness, checked continuously: a sampler notes every few tens of milliseconds whether
the line has an active instance (it said it became active and not since that it stepped
down, it runs, and the store holds the lock for it), and each time with none (a gap) is
held against the bound of the fault that caused it.

A gap's cause is the fault in progress when it began; one that began with no fault in
progress is put down to the fault that ended last if it began within that fault's bound
of its end (the pair was still recovering), else to no fault ("none"). A gap is measured
from the end of the fault in progress at its start, or else from its own start, and is a
violation past its bound: TTL + 300 ms, plus one TTL of lock delay where the store lost its
contents (`FaultSpan.bound_s`); a gap with no cause gets TTL + 300 ms.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SLACK_S = 0.3
"""The liveness bound's allowance above the TTL."""


@dataclass(frozen=True, slots=True)
class FaultSpan:
    kind: str
    started: float
    ended: float
    bound_s: float
    """How long after `ended` the line may be without an active instance."""


@dataclass(frozen=True, slots=True)
class Gap:
    start: float
    end: float
    step_s: float
    """The longest interval between the samples around it (how exact it is)."""


@dataclass
class Judged:
    gap: Gap
    kind: str
    measured_s: float
    bound_s: float
    in_progress: bool

    @property
    def violation(self) -> bool:
        return self.measured_s > self.bound_s


def judge(gaps: list[Gap], faults: list[FaultSpan], ttl_s: float) -> list[Judged]:
    """Each gap with its cause, its measure and its bound."""
    judged = []
    for gap in gaps:
        during = [f for f in faults if f.started <= gap.start <= f.ended]
        if during:
            cause = max(during, key=lambda f: f.ended)
            measured = max(0.0, gap.end - cause.ended)
            judged.append(Judged(gap, cause.kind, measured, cause.bound_s, True))
            continue
        before = [f for f in faults if f.ended < gap.start]
        last = max(before, key=lambda f: f.ended, default=None)
        measured = gap.end - gap.start
        if last is not None and gap.start - last.ended <= last.bound_s:
            judged.append(Judged(gap, last.kind, measured, last.bound_s, False))
        else:
            judged.append(Judged(gap, "none", measured, ttl_s + SLACK_S, False))
    return judged


def report(judged: list[Judged]) -> dict[str, dict[str, Any]]:
    """Per fault kind: the worst gap (as long as it was, and as measured), its bound, how
    many gaps there were and how many broke the bound."""
    by_kind: dict[str, dict[str, Any]] = {}
    for item in judged:
        entry = by_kind.setdefault(
            item.kind,
            {"gaps": 0, "worst_gap_ms": 0, "worst_measured_ms": 0, "bound_ms": 0, "over": 0},
        )
        entry["gaps"] += 1
        entry["worst_gap_ms"] = max(
            entry["worst_gap_ms"], round((item.gap.end - item.gap.start) * 1000)
        )
        entry["worst_measured_ms"] = max(entry["worst_measured_ms"], round(item.measured_s * 1000))
        entry["bound_ms"] = max(entry["bound_ms"], round(item.bound_s * 1000))
        entry["over"] += item.violation
    return dict(sorted(by_kind.items()))


def describe(item: Judged) -> str:
    gap = item.gap
    how = "from the end of" if item.in_progress else "from its start, after"
    return (
        f"no active for {(gap.end - gap.start) * 1000:.0f} ms ({gap.start:.3f} to "
        f"{gap.end:.3f}), {item.measured_s * 1000:.0f} ms {how} {item.kind}; bound "
        f"{item.bound_s * 1000:.0f} ms (sampled every {gap.step_s * 1000:.0f} ms or better)"
    )


@dataclass
class Sampler:
    """Samples `live()` on a thread of its own every `step_s`, and runs `also()` (the
    soak's collection of what the line recorded) every `also_every` steps on another: a
    collection that takes long under load must not space the samples out (a gap is only
    as exact as the samples around it)."""

    live: Callable[[], bool]
    also: Callable[[], None] = lambda: None
    step_s: float = 0.025
    also_every: int = 4
    gaps: list[Gap] = field(default_factory=list)
    samples: int = 0
    worst_step_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _also_thread: threading.Thread | None = None
    _open: float | None = None
    _open_step: float = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="soak-liveness", daemon=True)
        self._thread.start()
        self._also_thread = threading.Thread(
            target=self._run_also, name="soak-collection", daemon=True
        )
        self._also_thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in (self._thread, self._also_thread):
            if thread is not None:
                thread.join(10)
        if self._open is not None:
            self.gaps.append(Gap(self._open, time.monotonic(), self._open_step))
            self._open = None

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            try:
                live = self.live()
            except Exception as exc:  # a sample that failed says nothing either way
                if len(self.errors) < 5:
                    self.errors.append(repr(exc))
                live = None
            now = time.monotonic()
            step = now - last
            last = now
            self.samples += 1
            self.worst_step_s = max(self.worst_step_s, step)
            if live is False and self._open is None:
                self._open = now
                self._open_step = step
            elif live and self._open is not None:
                self.gaps.append(Gap(self._open, now, max(self._open_step, step)))
                self._open = None
            self._stop.wait(self.step_s)

    def _run_also(self) -> None:
        while not self._stop.wait(self.step_s * self.also_every):
            try:
                self.also()
            except Exception as exc:
                if len(self.errors) < 5:
                    self.errors.append(repr(exc))
