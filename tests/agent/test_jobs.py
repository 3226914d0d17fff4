"""The periodic jobs end quietly when a stop cancels them (APScheduler would log a cancelled
job as a failure, with its traceback)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from agent.runtime import jobs


async def test_a_job_cancelled_by_a_stop_leaves_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = asyncio.Event()

    async def waits_for_a_puback() -> None:
        started.set()
        await asyncio.Event().wait()

    scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop())
    scheduler.start()
    scheduler.add_job(jobs.ends_quietly(waits_for_a_puback), **jobs.OPTIONS)
    await asyncio.wait_for(started.wait(), 5)
    scheduler.shutdown(wait=False)
    running = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    with caplog.at_level(logging.DEBUG, logger="apscheduler"):
        for task in running:  # what asyncio.run does to the tasks left at the end
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
