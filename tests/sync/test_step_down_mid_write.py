"""A point whose controller is handed back (the instance steps down) while the pending
record of a remote change's write is on its way: the write does not go out, and nothing
fails. Before, the write went to a controller that was no longer there and the worker
logged a traceback (seen in the 30-minute soaks whenever a fenced write was refused under
load)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agent.controller.points import SET_POINT
from agent.protocol.hlc import Hlc
from agent.sync.decisions import ApplyToController, Synced
from tests.sync.support import point_sync


def v(n: int) -> Hlc:
    return Hlc(1_700_000_000_000 + n, 0, "s")


class HeldRecord:
    """Record writes wait until the test lets them through."""

    token = v(0)

    def __init__(self) -> None:
        self.writing, self.let_through = asyncio.Event(), asyncio.Event()

    async def fenced_set(self, key: str, value: bytes, **_: Any) -> Any:
        self.writing.set()
        await self.let_through.wait()
        return None


class NoWrites:
    async def write_point(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("written after the controller was handed back")


async def test_a_write_whose_controller_was_handed_back_does_not_go_out(tmp_path: Path) -> None:
    store = HeldRecord()
    sync = point_sync(tmp_path, SET_POINT, store)
    sync.status.synced = Synced(20.0, v(1))
    sync.record.update("setPoint", sync.status.synced, ())
    sync.controller = NoWrites()  # type: ignore[assignment]
    applying = asyncio.ensure_future(sync._apply(ApplyToController(22.0, v(2)), 20.0, 0.0))
    await asyncio.wait_for(store.writing.wait(), 5)
    assert sync.release() is not None  # stepped down meanwhile
    store.let_through.set()
    assert await applying is None
    assert sync.status.pending == ()  # nothing went out
