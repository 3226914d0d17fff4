"""The points of a unit that read it at once share one transaction: a re-check of a whole
thermostat (six points) cost six reads of the unit, and on a line of 32 a remote change
waited behind 192 of them (about 20 s at 9600 baud)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agent.controller.driver import Unit
from agent.line.handle import DeviceHandle
from agent.line.schedule import Kind, Op


class CountingBus:
    on_availability = None
    line_up = True

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.release = asyncio.Event()

    async def run(self, op: Op, allowed: Callable[[], bool] | None = None) -> Any:
        self.ops.append(op)
        await self.release.wait()
        if op.kind is Kind.READ:
            return f"state {len(self.ops)}"
        raise RuntimeError("the unit did not answer")


async def test_reads_asked_at_once_share_one_transaction() -> None:
    bus = CountingBus()
    handle = DeviceHandle(bus, Unit("t01", 1))
    readers = [asyncio.ensure_future(handle.read_state()) for _ in range(6)]
    await asyncio.sleep(0)
    bus.release.set()
    assert await asyncio.gather(*readers) == ["state 1"] * 6
    assert [op.kind for op in bus.ops] == [Kind.READ]
    # A read asked once that one is over is a transaction of its own.
    assert await handle.read_state() == "state 2"


async def test_a_failed_shared_read_fails_every_reader_and_one_giving_up_leaves_the_rest() -> None:
    bus = CountingBus()
    handle = DeviceHandle(bus, Unit("t01", 1))
    first = asyncio.ensure_future(handle.read_limits())
    second = asyncio.ensure_future(handle.read_limits())
    await asyncio.sleep(0)
    first.cancel()
    bus.release.set()
    with pytest.raises(RuntimeError):
        await second
    assert len(bus.ops) == 1
