"""One point's sync of device `t01` against a fake store (client and lock at once), for the
tests of what a point does around its store writes, and the simplest such store."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from agent.client.statestore import SetResult
from agent.controller.points import Point
from agent.protocol.hlc import Hlc
from agent.sync.device_record import DeviceRecord
from agent.sync.point import PointSync
from agent.sync.state_file import LaterSaves, StateFile


def point_sync(
    tmp_path: Path, point: Point, store: Any, later: LaterSaves | None = None
) -> PointSync:
    """`store` answers the point's GETs and its fenced writes (the key's and the record's);
    `later`: where its syncs' saves may wait (else each is saved at once)."""
    return PointSync(
        "t01",
        point,
        f"t01\\{point.name}",
        store,
        store,
        DeviceRecord("t01\\synced", store, lambda: True),
        StateFile(tmp_path, f"t01.{point.name}", point.name, later=later),
        logging.getLogger("test"),
        lambda: True,
        lambda state: None,  # type: ignore[arg-type,return-value]
    )


def v(n: int) -> Hlc:
    return Hlc(1_700_000_000_000 + n, 0, "s")


class KeyStore:
    """The point's key holds `value` at version 5, a remote change newer than anything the
    unit was synced at; every fenced write is accepted and kept (`writes`)."""

    def __init__(self, value: bytes) -> None:
        self.value = value
        self.token = v(10)
        self.writes: list[tuple[str, bytes]] = []

    async def get(self, key: str, **_: Any) -> tuple[bytes | None, Hlc | None]:
        return self.value, v(5)

    async def fenced_set(self, key: str, value: bytes, **_: Any) -> SetResult:
        self.writes.append((key, value))
        return SetResult(True, v(20 + len(self.writes)))

    def delivered_since(self, key: str) -> Hlc | None:
        return None
