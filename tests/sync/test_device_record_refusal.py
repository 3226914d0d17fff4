"""A refusal in a device's record stays until its point syncs a newer version: then status
no longer shows it as if it were news."""

from __future__ import annotations

from typing import Any

from agent.protocol.hlc import Hlc
from agent.sync.device_record import DeviceRecord
from agent.sync.record import Refusal

REFUSED_AT = Hlc(1_000, 0, "store")


def record_refusing(point: str = "setPoint") -> DeviceRecord:
    lock: Any = None  # not written here
    record = DeviceRecord("t01\\synced", lock, lambda: False)
    record.refused = Refusal(point, "99", REFUSED_AT, "99 is above the limit 35")
    return record


def test_a_sync_since_the_refusal_ends_it() -> None:
    record = record_refusing()
    record.synced_since("setPoint", Hlc(900, 0, "store"))  # older: not since
    assert record.refused is not None
    record.synced_since("mode", Hlc(2_000, 0, "store"))  # another point's
    assert record.refused is not None
    record.synced_since("setPoint", Hlc(2_000, 0, "store"))
    assert record.refused is None
