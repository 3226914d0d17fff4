"""The record marked with a publish is the one sent right behind the value: a takeover
reads the marker against that record's version (decisions.published_marker), so no other
record may carry the mark, and none may slip in between."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agent.client.statestore import SetResult
from agent.protocol.hlc import Hlc
from agent.sync.decisions import Synced
from agent.sync.device_record import DeviceRecord, Written


class HeldLock:
    """Fenced writes in the order they were sent; each answered when the test says so."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.answer = asyncio.Event()
        self.token = Hlc(1_700_000_000_000, 7, "s")

    async def fenced_set(self, key: str, value: bytes, **_: Any) -> SetResult:
        self.sent.append((key, value))
        await self.answer.wait()
        return SetResult(True, v(5))


def v(n: int) -> Hlc:
    return Hlc(1_700_000_000_000 + n, 0, "s")


async def test_the_mark_is_in_the_one_record_behind_the_value() -> None:
    lock = HeldLock()
    record = DeviceRecord("t01\\synced", lock, lambda: True)  # type: ignore[arg-type]
    record.update("setPoint", Synced(20.0, v(1)), ())
    record.update("mode", Synced("heat", v(2)), ())
    publishing = asyncio.ensure_future(
        record.publish_marked(
            "setPoint",
            Synced(20.0, v(1)),
            (),
            16.5,
            lambda: lock.fenced_set("t01\\setPoint", b"16.5"),
        )
    )
    for _ in range(10):
        await asyncio.sleep(0)
    # Another point syncs while the value is on its way: its record waits.
    record.update("mode", Synced("cool", v(3)), ())
    sibling = asyncio.ensure_future(record.write())
    for _ in range(10):
        await asyncio.sleep(0)
    assert [key for key, _ in lock.sent] == ["t01\\setPoint", "t01\\synced"]
    lock.answer.set()
    await publishing
    assert await sibling is Written.OK
    marked, after = (json.loads(raw) for key, raw in lock.sent[1:])
    assert marked["published"] == 16.5
    assert marked["publishedAfter"] == str(lock.token)  # the token the value went out with
    assert (
        "published" not in after
        and "publishedAfter" not in after
        and after["points"]["mode"]["value"] == "cool"
    )


async def test_a_publish_the_store_took_is_in_every_record_after_it() -> None:
    """A soak's stale publish: the set point's publish was answered, and the record another
    point had waiting went out before the set point recorded its new sync: without the mark
    and without the value. The active died then; the standby, which had not seen the value
    in the store, took the unit's value for a panel change and published it over a newer
    remote change. The answer now makes the entry synced before the lock is let go."""
    lock = HeldLock()
    record = DeviceRecord("t01\\synced", lock, lambda: True)  # type: ignore[arg-type]
    record.update("setPoint", Synced(20.0, v(1)), (Synced(21.0, v(2)), Synced(22.0, v(6))))
    record.update("mode", Synced("heat", v(2)), ())

    publishing = asyncio.ensure_future(
        record.publish_marked(
            "setPoint",
            Synced(20.0, v(1)),
            (Synced(21.0, v(2)), Synced(22.0, v(6))),
            16.5,
            lambda: lock.fenced_set("t01\\setPoint", b"16.5"),  # taken at version 5
        )
    )
    for _ in range(10):
        await asyncio.sleep(0)
    record.update("mode", Synced("cool", v(3)), ())
    sibling = asyncio.ensure_future(record.write())
    lock.answer.set()
    assert await publishing == SetResult(True, v(5))
    assert await sibling is Written.OK
    after = json.loads(lock.sent[-1][1])
    assert (after["value"], after["version"]) == (16.5, str(v(5)))
    assert after["pending"] == [{"value": 22.0, "version": str(v(6))}]  # newer: still in doubt
    assert "published" not in after and after["points"]["mode"]["value"] == "cool"


async def test_a_publish_the_store_did_not_take_leaves_the_entry_as_it_was() -> None:
    lock = HeldLock()
    lock.answer.set()
    record = DeviceRecord("t01\\synced", lock, lambda: True)  # type: ignore[arg-type]
    record.update("setPoint", Synced(20.0, v(1)), ())

    async def publish() -> SetResult:
        return SetResult(False, None)  # a remote change reached the empty key first

    await record.publish_marked(
        "setPoint",
        Synced(20.0, v(1)),
        (),
        16.5,
        publish,
    )
    assert await record.write() is Written.OK
    after = json.loads(lock.sent[-1][1])
    assert (after["value"], "published" in after) == (20.0, False)
