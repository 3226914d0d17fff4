"""Notices wall-clock steps (NTP) by comparing the wall clock with the monotonic clock, and
times when this process did not run at all.

Nothing the agent times runs on the wall clock (the lease, its renewals and the periodic
jobs keep to the monotonic one): a step is said because every timestamp moves with it, in
the logs, the telemetry and the store's hybrid logical clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ClockStepDetector:
    def __init__(
        self,
        threshold_s: float = 1.0,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold_s = threshold_s
        self._wall, self._monotonic = wall, monotonic
        self._offset = wall() - monotonic()

    def check(self) -> float | None:
        """The step since the last check, in seconds (negative: back), or None."""
        offset = self._wall() - self._monotonic()
        step = offset - self._offset
        self._offset = offset
        return step if abs(step) >= self.threshold_s else None


class StallDetector:
    """Notices that this process did not run for a while (stopped, starved of CPU, swapping):
    a wake-up due every `period_s` that comes later than that by `threshold_s` or more. The
    lease does not care why renewals stopped; an operator needs to know it was the gateway."""

    def __init__(
        self,
        period_s: float,
        threshold_s: float = 0.25,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.period_s, self.threshold_s = period_s, threshold_s
        self._monotonic = monotonic
        self._last = monotonic()

    def check(self) -> float | None:
        """How late this wake-up came (seconds), or None when within the threshold."""
        now = self._monotonic()
        late = now - self._last - self.period_s
        self._last = now
        return late if late >= self.threshold_s else None


def stalled(late_s: float, driving: bool, ttl_ms: int) -> str:
    """The operator's line for a stall of `late_s`."""
    return (
        f"this process did not run for {late_s:.2f} s"
        + (" while it drove the line" if driving else "")
        + " (stopped, or the gateway short of CPU or memory): a lease of "
        f"{ttl_ms} ms (AGENT_LOCK__TTL_MS) ends when renewals stop that long; find what "
        "starves the process"
    )
