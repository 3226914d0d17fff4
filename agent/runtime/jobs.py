"""How the agent's periodic jobs run under APScheduler: one at a time, a late run folded into
the next, and a cancellation by a stop that ends a job quietly."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

OPTIONS: dict[str, Any] = {"coalesce": True, "max_instances": 1, "misfire_grace_time": 5}


def ends_quietly(job: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """`job`, returning when a stop cancels it: the scheduler's executor logs a cancelled
    job as one that failed, with its traceback (a soak saw it at a SIGTERM that caught the
    telemetry job waiting for a PUBACK)."""

    @functools.wraps(job)
    async def run() -> None:
        try:
            await job()
        except asyncio.CancelledError:
            return

    return run
