"""A publish whose answer never came (its connection lost, or timed out) on an active that
keeps its lease: the store may have taken it and, after it, a remote change. The record sent
right behind it on the same connection is the evidence, so it is read back before any other
record can overwrite its mark (a 30-minute soak's reverted remote change, seed 651)."""

from __future__ import annotations

from typing import Any

import pytest

from agent.client.session import LostInFlight, NotConnected
from agent.client.statestore import SetResult
from agent.protocol.hlc import Hlc
from agent.sync.decisions import Synced
from agent.sync.device_record import DeviceRecord, MarkNotReadBack, Written

RECORD = "t01\\synced"
SETPOINT = "t01\\setPoint"


def v(n: int) -> Hlc:
    return Hlc(1_700_000_000_000 + n, 0, "s")


class CutStore:
    """Keeps what it is sent; the answers to `lost` keys are lost with the connection, and
    `refused` keys never reach it. Client and lock at once."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[bytes, Hlc]] = {}
        self.sent: list[str] = []  # in order: "SET key", "GET key"
        self.lost: set[str] = set()
        self.refused: set[str] = set()
        self.reachable = True
        self.token = v(0)
        self.client = self
        self._clock = 0

    async def fenced_set(self, key: str, value: bytes, **_: Any) -> SetResult:
        self.sent.append(f"SET {key}")
        if not self.reachable:
            raise NotConnected("not connected")
        if key in self.refused:
            raise LostInFlight("lost the connection before the acknowledgement")
        self._clock += 1
        self.keys[key] = (value, v(self._clock))
        if key in self.lost:
            raise LostInFlight("lost the connection before the acknowledgement")
        return SetResult(True, v(self._clock))

    async def get(self, key: str) -> tuple[bytes | None, Hlc | None]:
        self.sent.append(f"GET {key}")
        if not self.reachable:
            raise NotConnected("not connected")
        value, version = self.keys.get(key, (None, None))
        return value, version


def device_record(store: CutStore) -> DeviceRecord:
    record = DeviceRecord(RECORD, store, lambda: True)  # type: ignore[arg-type]
    record.update("setPoint", Synced(20.0, v(0)), ())
    return record


async def publish(record: DeviceRecord, store: CutStore, value: float = 18.5) -> SetResult:
    async def send() -> SetResult:
        return await store.fenced_set(SETPOINT, str(value).encode())

    return await record.publish_marked("setPoint", Synced(20.0, v(0)), (), value, send)


async def publish_lost(record: DeviceRecord, store: CutStore) -> None:
    with pytest.raises(LostInFlight):
        await publish(record, store)


async def test_the_record_behind_a_lost_publish_is_read_back_before_another_is_sent() -> None:
    store = CutStore()
    store.lost = {SETPOINT, RECORD}
    record = device_record(store)
    await publish_lost(record, store)
    marked_at = store.keys[RECORD][1]
    assert record.in_doubt("setPoint")
    store.lost = set()
    record.update("mode", Synced("heat", v(9)), ())  # another point writes the record
    assert await record.write() is Written.OK
    assert store.sent[-2:] == [f"GET {RECORD}", f"SET {RECORD}"]
    found = await record.read_back("setPoint")  # the point asks later: kept for it
    assert found is not None
    assert found.version == marked_at
    assert found.entry.published == 18.5 and found.entry.published_after == v(0)
    assert not record.in_doubt("setPoint")


async def test_a_record_that_never_reached_the_store_is_no_evidence() -> None:
    store = CutStore()
    store.lost = {SETPOINT}
    store.refused = {RECORD}
    record = device_record(store)
    await publish_lost(record, store)
    assert await record.read_back("setPoint") is None


async def test_no_record_goes_out_while_the_mark_cannot_be_read_back() -> None:
    store = CutStore()
    store.lost = {SETPOINT, RECORD}
    record = device_record(store)
    await publish_lost(record, store)
    store.reachable = False
    tried = len(store.sent)
    assert await record.write() is Written.FAILED
    with pytest.raises(MarkNotReadBack):
        await publish(record, store, 19.0)
    assert store.sent[tried:] == [f"GET {RECORD}", f"GET {RECORD}"]  # no SET tried
    assert record.in_doubt("setPoint")
    store.reachable = True
    store.lost = set()
    found = await record.read_back("setPoint")
    assert found is not None and found.entry.published == 18.5


async def test_a_takeover_forgets_the_doubts_of_an_earlier_lease() -> None:
    store = CutStore()
    store.lost = {SETPOINT, RECORD}
    record = device_record(store)
    await publish_lost(record, store)
    record.forget_doubts()
    store.lost = set()
    assert not record.in_doubt("setPoint")
    assert await record.write() is Written.OK
    assert f"GET {RECORD}" not in store.sent
