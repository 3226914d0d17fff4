"""The periodic jobs (agent.runtime.jobs): due on a fixed grid of the monotonic clock, a late
run folded into the next, a failure said and the next run kept, a stop ending a run quietly."""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.runtime import jobs

times = st.floats(min_value=0, max_value=1e6, allow_nan=False)
intervals = st.floats(min_value=0.01, max_value=3600, allow_nan=False)


@given(times, intervals, st.floats(min_value=0, max_value=1e7, allow_nan=False))
def test_the_next_run_is_on_the_grid_and_never_past(
    start: float, interval: float, elapsed: float
) -> None:
    now = start + elapsed
    due = jobs.next_due(start, interval, now)
    assert due >= now
    assert due - now <= interval * (1 + 1e-9) + 1e-6  # runs missed fold into one
    periods = (due - start) / interval
    assert abs(periods - round(periods)) < 1e-6 * max(1.0, periods)


@given(times, intervals, st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_before_its_start_a_schedule_waits_for_the_start(
    start: float, interval: float, early: float
) -> None:
    assert jobs.next_due(start + early, interval, start) == start + early


async def test_a_job_runs_again_and_again_and_a_failure_does_not_end_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs: list[int] = []
    third = asyncio.Event()

    async def fails_on_its_first_run() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise OSError("the broker went away")
        if len(runs) == 3:
            third.set()

    task = asyncio.create_task(jobs.every("telemetry", 0.01, fails_on_its_first_run, first_s=0))
    await asyncio.wait_for(third.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(failures) == 1
    assert "periodic telemetry failed (OSError: the broker went away)" in failures[0].message


async def test_a_job_cancelled_by_a_stop_leaves_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = asyncio.Event()

    async def waits_for_a_puback() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(jobs.every("telemetry", 5, waits_for_a_puback, first_s=0))
    await asyncio.wait_for(started.wait(), 5)
    with caplog.at_level(logging.DEBUG):
        task.cancel()  # what the agent's stop does
        await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
