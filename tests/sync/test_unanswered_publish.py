"""A publish whose answer never comes (a slow link: the request timed out) may have reached
the store. The 30-minute multi-drop soak at TTL 3 s: the active published a panel change
(22.0), its answer timed out, a remote change (16.5) came after it, and the active was killed;
its later records no longer named 22.0, so the next active took the unit's 22.0 for a panel
change and published it over 16.5. Every record after names it as unanswered, until the
point syncs again, and a takeover counts it as a value the store had."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.client.errors import RequestTimeout
from agent.client.session import LostInFlight, NotConnected
from agent.client.statestore import SetResult
from agent.controller.interface import Limits
from agent.controller.points import SET_POINT
from agent.protocol.hlc import Hlc
from agent.sync.decisions import ApplyToController, Synced, reconcile, takeover_base
from agent.sync.record import PointRecord, encode_record, parse_full_record
from tests.sync.support import point_sync


def v(n: int) -> Hlc:
    return Hlc(1_700_000_000_000 + n, 0, "s")


class SlowStore:
    """Every write of the point's key fails with `error` (a timeout by default); the record's
    writes are kept. Once `error` is None, the key holds `value` (a remote change)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.records: list[dict[str, Any]] = []
        self.token = v(0)
        self.error = error or RequestTimeout("SET got no response within 2 s")
        self.value = (b"24.5", v(5))

    async def fenced_set(self, key: str, value: bytes, **_: Any) -> Any:
        if key.endswith("\\setPoint"):
            if self.error is not None:
                raise self.error
            return SetResult(True, v(6))
        self.records.append(json.loads(value))
        return SetResult(True, v(6))

    async def get(self, key: str) -> tuple[bytes | None, Hlc | None]:
        return self.value

    def delivered_since(self, key: str) -> Hlc | None:
        return None


IN_DOUBT = [
    RequestTimeout("SET got no response within 2 s"),
    LostInFlight("lost the connection to the broker before the acknowledgement"),
]


@pytest.mark.parametrize("error", IN_DOUBT, ids=["timed out", "link lost in flight"])
async def test_an_unanswered_publish_is_named_in_every_record_after(
    tmp_path: Path, error: Exception
) -> None:
    """A link lost with the publish sent is as unanswered as a timeout: the 10-minute soak
    (seed 621) lost its link to a store restart right after the store took the value."""
    store = SlowStore(error)
    sync = point_sync(tmp_path, SET_POINT, store)
    record = sync.record
    sync.status.synced = Synced(22.5, v(1))
    record.update("setPoint", sync.status.synced, ())
    await sync._publish(22.0, "local change")
    # Another point of the device writes the record later: the mark is still there.
    record.update("mode", Synced("heat", v(2)), ())
    await record.write()
    marked, *later = store.records
    assert marked["published"] == 22.0
    assert later and all(r.get("unanswered") == 22.0 for r in later), later


async def test_a_publish_never_sent_is_not_counted_as_the_stores(tmp_path: Path) -> None:
    store = SlowStore(NotConnected("not connected to the broker"))
    sync = point_sync(tmp_path, SET_POINT, store)
    sync.status.synced = Synced(22.5, v(1))
    sync.record.update("setPoint", sync.status.synced, ())
    await sync._publish(22.0, "local change")
    sync.record.update("mode", Synced("heat", v(2)), ())
    await sync.record.write()
    assert all("unanswered" not in r for r in store.records[1:]), store.records


async def test_a_takeover_counts_its_own_unanswered_publish_when_the_record_forgot_it(
    tmp_path: Path,
) -> None:
    """The store restarted without its contents right after it took our publish (18.5), its
    answer lost with the link; the record the next active wrote on the emptied store knew
    nothing of it. When this instance takes over again the unit's 18.5 is its own publish,
    counted as the store's (a remote change made since wins), and every record says so
    until the takeover is reconciled."""
    store = SlowStore(LostInFlight("lost the connection before the acknowledgement"))
    sync = point_sync(tmp_path, SET_POINT, store)
    sync.status.synced = Synced(20.0, v(1))
    sync.record.update("setPoint", sync.status.synced, ())
    await sync._publish(18.5, "local change")
    store.error = None
    # The record of the emptied store's active: the same sync, no mark.
    await sync.follow_record(PointRecord(Synced(20.0, v(1))))
    await sync.take_over(object(), PointRecord(Synced(20.0, v(1))), v(4))  # type: ignore[arg-type]
    entry = sync.record.entries["setPoint"]
    assert entry.unanswered == 18.5
    base = takeover_base(sync.status.synced, entry.synced, [], 18.5, published=entry.unanswered)
    assert reconcile(base, b"24.5", v(5), 18.5, Limits(5.0, 35.0, 0.5)) == ApplyToController(
        24.5, v(5)
    )


async def test_an_unanswered_publish_is_settled_by_a_newer_sync_of_the_other_instance(
    tmp_path: Path,
) -> None:
    """The other instance synced the point since: our publish in doubt is history, and a
    panel change to its value later is a panel change."""
    store = SlowStore()
    sync = point_sync(tmp_path, SET_POINT, store)
    sync.status.synced = Synced(20.0, v(1))
    sync.record.update("setPoint", sync.status.synced, ())
    await sync._publish(18.5, "local change")
    store.error = None
    await sync.follow_record(PointRecord(Synced(22.0, v(3))))
    await sync.take_over(object(), PointRecord(Synced(22.0, v(3))), v(4))  # type: ignore[arg-type]
    assert sync.record.entries["setPoint"].unanswered is None


def test_a_takeover_counts_an_unanswered_publish_as_the_stores() -> None:
    raw = encode_record(Synced(22.5, v(1)), unanswered=22.0)
    entry = parse_full_record(raw).point("setPoint")
    assert entry is not None and entry.unanswered == 22.0
    base = takeover_base(entry.synced, entry.synced, [], 22.0, published=entry.unanswered)
    decision = reconcile(base, b"16.5", v(3), 22.0, Limits(5.0, 35.0, 0.5))
    assert decision == ApplyToController(16.5, v(3))
