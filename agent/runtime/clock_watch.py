"""The task that watches this process's clocks (agent.runtime.clock_guard): a stall is said
(with what it cost while driving), and so is a wall-clock step, which costs nothing (the
lease and the periodic jobs run on the monotonic clock) but moves every timestamp."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from agent.runtime.clock_guard import ClockStepDetector, StallDetector, stalled

log = logging.getLogger("agent")

PERIOD_S = 0.5


async def watch_clock(driving: Callable[[], bool], ttl_ms: int) -> None:
    detector = ClockStepDetector()
    stalls = StallDetector(period_s=PERIOD_S)
    while True:
        await asyncio.sleep(PERIOD_S)
        late = stalls.check()
        if late is not None:
            log.warning(stalled(late, driving(), ttl_ms))
        step = detector.check()
        if step is not None:
            log.warning(
                "wall clock stepped by %+.1f s: the lease and the jobs keep to the monotonic "
                "clock; timestamps in logs and telemetry move with the step",
                step,
            )
