"""The job that watches this process's clocks (agent.runtime.clock_guard): a stall is said
(with what it cost while driving), a wall-clock step reruns the scheduler's jobs at once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from agent.runtime.clock_guard import ClockStepDetector, StallDetector, stalled

log = logging.getLogger("agent")

PERIOD_S = 0.5


async def watch_clock(
    driving: Callable[[], bool], ttl_ms: int, scheduler: Callable[[], AsyncIOScheduler | None]
) -> None:
    detector = ClockStepDetector()
    stalls = StallDetector(period_s=PERIOD_S)
    while True:
        await asyncio.sleep(PERIOD_S)
        late = stalls.check()
        if late is not None:
            log.warning(stalled(late, driving(), ttl_ms))
        step = detector.check()
        jobs = scheduler()
        if step is not None and jobs is not None:
            log.warning("wall clock stepped by %+.1f s: rescheduling jobs", step)
            now = datetime.now().astimezone()
            for job in jobs.get_jobs():
                job.modify(next_run_time=now)
            jobs.wakeup()
