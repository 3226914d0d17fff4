"""One point's sync of device `t01` against a fake store (client and lock at once), for the
tests of what a point does around its store writes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from agent.controller.points import Point
from agent.sync.device_record import DeviceRecord
from agent.sync.point import PointSync
from agent.sync.state_file import StateFile


def point_sync(tmp_path: Path, point: Point, store: Any) -> PointSync:
    """`store` answers the point's GETs and its fenced writes (the key's and the record's)."""
    return PointSync(
        "t01",
        point,
        f"t01\\{point.name}",
        store,
        store,
        DeviceRecord("t01\\synced", store, lambda: True),
        StateFile(tmp_path, f"t01.{point.name}", point.name),
        logging.getLogger("test"),
        lambda: True,
        lambda state: None,  # type: ignore[arg-type,return-value]
    )
