"""The agent's periodic jobs (the reconcile safety net, telemetry): each a task of its own on
the monotonic clock, one run at a time, a late run folded into the next, a run that fails
said and the next one kept, a stop that cancels a run ending it quietly.

On the monotonic clock, a wall-clock step (NTP) neither delays nor hurries them. This
replaces APScheduler, whose scheduler runs on the wall clock (the agent had to notice steps
and reschedule) and whose import (its executors bring multiprocessing, its plugins
importlib.metadata and email: 4.1 MB measured at import) was memory a gateway spends for
two interval timers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("agent")


# --------------------------------------------------------------------------- pure


def next_due(start: float, interval_s: float, now: float) -> float:
    """The first due time of a schedule (`start`, then every `interval_s`) that is not past
    at `now`: runs missed while the previous one ran, or the process stalled, fold into it."""
    if now <= start:
        return start
    due = start + math.ceil((now - start) / interval_s) * interval_s
    return due if due >= now else due + interval_s  # the division rounded down


# --------------------------------------------------------------------------- the task


async def every(
    name: str,
    interval_s: float,
    job: Callable[[], Awaitable[None]],
    *,
    first_s: float | None = None,
    jitter_s: float = 0.0,
) -> None:
    """Runs `job` every `interval_s` (the first after `first_s`, by default one interval),
    each run up to `jitter_s` after its due time, until cancelled."""
    clock = time.monotonic
    start = clock() + (interval_s if first_s is None else first_s)
    due = start
    while True:
        wait = due + random.uniform(0.0, jitter_s) - clock()
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            await job()  # a stop cancels it: the task ends, and nothing is said
        except Exception as exc:
            log.error("periodic %s failed (%s: %s): runs again in %.0f s",
                      name, type(exc).__name__, exc, interval_s)  # fmt: skip
            log.debug("periodic %s failed", name, exc_info=True)
        # The next due time after this run's (half an interval on, so never this one again
        # however fast the run), or after now if the run outlasted the interval.
        due = next_due(start, interval_s, max(clock(), due + interval_s / 2))
