"""Pending writes are a set. A reload while a write hangs makes the device's point anew: it
loads the write from its state file, then its takeover reads it again in the record. Kept
once for each, the same write stood three times in the record and twice in the state file;
only MAX_PENDING are kept, so a duplicate pushed out a distinct older write, and the unit
holding that one was then taken for a panel change."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agent.controller.points import SET_POINT
from agent.protocol.hlc import Hlc
from agent.sync.decisions import MAX_PENDING, ApplyToController, Synced, still_pending
from tests.sync.support import point_sync


def v(n: int) -> Hlc:
    return Hlc(1_700_000_000_000 + n, 0, "s")


class Store:
    """Answers the point's reads (an empty key) and takes its fenced writes."""

    token = v(0)

    async def get(self, key: str) -> tuple[bytes | None, Hlc | None]:
        return None, None

    async def fenced_set(self, key: str, value: bytes, **_: Any) -> Any:
        return None

    def delivered_since(self, key: str) -> float | None:
        return None


class HangingController:
    """A write that never answers (a unit that went quiet mid-write)."""

    def __init__(self) -> None:
        self.writing = asyncio.Event()

    async def write_point(self, *args: Any, **kwargs: Any) -> Any:
        self.writing.set()
        await asyncio.Event().wait()


async def test_a_reload_while_a_write_hangs_keeps_the_write_once(tmp_path: Path) -> None:
    store, controller = Store(), HangingController()
    before = point_sync(tmp_path, SET_POINT, store)
    older = Synced(21.0, v(2))
    before.status.synced = Synced(20.0, v(1))
    before.status.pending = (older,)
    before.controller = controller  # type: ignore[assignment]
    writing = asyncio.ensure_future(before._apply(ApplyToController(22.0, v(3)), 20.0, 0.0))
    await asyncio.wait_for(controller.writing.wait(), 5)
    entry = before.record.entries[SET_POINT.name]
    the_write = Synced(22.0, v(3))
    assert entry.pending == (older, the_write)
    # The reload: the point made anew, from its state file, and taken over with the record.
    after = point_sync(tmp_path, SET_POINT, store)
    assert after.status.pending == (older, the_write)
    await after.take_over(controller, entry, v(3))  # type: ignore[arg-type]
    assert after.status.pending == (older, the_write)
    after.enter_in_record()
    assert after.record.entries[SET_POINT.name].pending == (older, the_write)
    await after._save_locally()
    assert after.state_file.load_pending() == (older, the_write)
    writing.cancel()


writes = st.builds(Synced, st.sampled_from([20.0, 21.0, 22.5]), st.integers(1, 9).map(v))


@given(st.lists(writes, max_size=12), st.integers(0, 9))
def test_pending_writes_are_a_bounded_set_of_the_newest(
    known: list[Synced], synced_at: int
) -> None:
    synced = Synced(20.0, v(synced_at) if synced_at else None)
    kept = still_pending(known, synced)
    unsettled = {w for w in known if synced.version is None or version(w) > synced.version}
    assert len(set(kept)) == len(kept) == min(len(unsettled), MAX_PENDING)
    assert set(kept) <= unsettled
    dropped = unsettled - set(kept)
    assert all(version(d) <= version(k) for d in dropped for k in kept)
    assert [version(w) for w in kept] == sorted(version(w) for w in kept)
    assert still_pending((*kept, *kept), synced) == kept


def version(write: Synced) -> Hlc:
    assert write.version is not None
    return write.version
