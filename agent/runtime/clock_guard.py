"""Notices wall-clock steps (NTP) by comparing the wall clock with the monotonic clock.

APScheduler computes run times on the wall clock: after a step back it would wait out
the step before the next renewal. Lease safety never depends on it (the lease deadline is
on the monotonic clock), but a stall would cost a needless failover, so on a step the
jobs are run again at once.
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
