"""A point taken over decides nothing before its fence is done: a remote change (or a
reading) that arrives between the takeover's start and its fence waits for the takeover's
reconcile, which judges it on what the former active last had on the controller. Handled
at once, it was judged on the base this instance had as standby, and a value the former
active had published was taken for a panel change and published over the remote change
(seen in a 30-minute soak of whole thermostats)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agent.client.statestore import KeyChange
from agent.controller.points import FAN
from agent.protocol.hlc import Hlc
from tests.sync.support import point_sync


class HeldFence:
    """The store as the fence sees it: the key's value, and a write back that waits until
    the test lets it through."""

    def __init__(self) -> None:
        self.let_through = asyncio.Event()
        self.fencing = asyncio.Event()
        self.bulk = asyncio.Semaphore(64)

    async def get(self, key: str, **_: Any) -> tuple[bytes | None, Hlc | None]:
        return b"low", Hlc(1_700_000_000_000, 1, "s")

    async def fenced_set(self, key: str, value: bytes, **_: Any) -> Any:
        self.fencing.set()
        await self.let_through.wait()
        raise asyncio.CancelledError  # the test ends here


async def test_a_remote_change_during_the_fence_waits_for_the_takeover(tmp_path: Path) -> None:
    store = HeldFence()
    sync = point_sync(tmp_path, FAN, store)
    sync.start()
    taking_over = asyncio.ensure_future(sync.take_over(object(), None))  # type: ignore[arg-type]
    await asyncio.wait_for(store.fencing.wait(), 5)
    change = KeyChange(b"t01\\fan", "SET", b"high", Hlc(1_700_000_000_500, 0, "s"))
    sync.remote_changed(change)
    for _ in range(20):
        await asyncio.sleep(0)
    assert sync._remote is not None and sync._remote[1] is change, "decided before the fence"
    taking_over.cancel()
    await sync.stop()
