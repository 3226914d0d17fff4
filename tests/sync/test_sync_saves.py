"""Which syncs reach the disk before the store's record says them. A soak's pair: the active
published a panel change (18.5) and its record, and was killed before its batched save; the
store then restarted without its contents. Restarted, the instance knew only its older sync
(20.0), wrote that as the record, and the standby took the unit's 18.5 for a panel change
made while nobody drove the line, published over a remote change made since. A published
value is saved before the record names it; a sync that settles the agent's own write, whose
pending entry the disk already has, may still wait for the next batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.client.statestore import SetResult
from agent.controller.points import SET_POINT
from agent.protocol.hlc import Hlc
from agent.sync.decisions import Synced
from agent.sync.state_file import LaterSaves, StateFile
from tests.sync.support import point_sync, v


class DiskWatchingStore:
    """Accepts every fenced write; for each record written, what the point's state file on
    disk held at that moment (`disk_at_records`)."""

    def __init__(self, tmp_path: Path) -> None:
        self.token = v(10)
        self.disk = StateFile(tmp_path, "t01.setPoint", SET_POINT.name)
        self.disk_at_records: list[tuple[Any, Synced]] = []
        self.writes = 0

    async def get(self, key: str, **_: Any) -> tuple[bytes | None, Hlc | None]:
        return None, None

    async def fenced_set(self, key: str, value: bytes, **_: Any) -> SetResult:
        self.writes += 1
        if key.endswith("\\synced"):
            self.disk_at_records.append((json.loads(value).get("value"), self.disk.load()))
        return SetResult(True, v(20 + self.writes))

    def delivered_since(self, key: str) -> Hlc | None:
        return None


async def test_a_published_panel_change_is_on_disk_before_the_record_names_it(
    tmp_path: Path,
) -> None:
    store = DiskWatchingStore(tmp_path)
    later = LaterSaves(within_s=60)  # a batch that never comes within the test
    sync = point_sync(tmp_path, SET_POINT, store, later)
    sync.status.synced = Synced(20.0, v(1))
    await sync._publish(18.5, "local change")
    named = [disk for value, disk in store.disk_at_records if value == 18.5]
    assert named, store.disk_at_records
    assert all(disk.value == 18.5 for disk in named), named
    await later.close()


async def test_a_sync_that_settles_the_agents_own_write_waits_for_the_batch(
    tmp_path: Path,
) -> None:
    store = DiskWatchingStore(tmp_path)
    later = LaterSaves(within_s=60)
    sync = point_sync(tmp_path, SET_POINT, store, later)
    sync.status.synced = Synced(20.0, v(1))
    sync.status.pending = (Synced(24.5, v(5)),)  # saved before the write went out
    await sync.state_file.store(sync.status.synced, sync.status.pending)
    await sync._record(24.5, v(5))
    assert sync.state_file.load() == Synced(20.0, v(1)), "saved at once"
    assert sync.state_file.load_pending() == (Synced(24.5, v(5)),)
    await later.close()
    assert sync.state_file.load() == Synced(24.5, v(5))
