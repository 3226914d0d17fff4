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

from agent.client.errors import RequestTimeout
from agent.controller.interface import Limits
from agent.controller.points import SET_POINT
from agent.protocol.hlc import Hlc
from agent.sync.decisions import ApplyToController, Synced, reconcile, takeover_base
from agent.sync.record import encode_record, parse_full_record
from tests.sync.support import point_sync


def v(n: int) -> Hlc:
    return Hlc(1_700_000_000_000 + n, 0, "s")


class SlowStore:
    """Every write of the point's key times out; the record's writes are kept."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.token = v(0)
        self.client = self

    async def fenced_set(self, key: str, value: bytes, **_: Any) -> Any:
        if key.endswith("\\setPoint"):
            raise RequestTimeout("SET got no response within 2 s")
        self.records.append(json.loads(value))
        return None

    async def get(self, key: str) -> tuple[bytes | None, Hlc | None]:
        if not self.records:
            return None, None
        return json.dumps(self.records[-1]).encode(), v(10 + len(self.records))


async def test_an_unanswered_publish_is_named_in_every_record_after(tmp_path: Path) -> None:
    store = SlowStore()
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


def test_a_takeover_counts_an_unanswered_publish_as_the_stores() -> None:
    raw = encode_record(Synced(22.5, v(1)), unanswered=22.0)
    entry = parse_full_record(raw).point("setPoint")
    assert entry is not None and entry.unanswered == 22.0
    base = takeover_base(entry.synced, entry.synced, [], 22.0, published=entry.unanswered)
    decision = reconcile(base, b"16.5", v(3), 22.0, Limits(5.0, 35.0, 0.5))
    assert decision == ApplyToController(16.5, v(3))
