"""StoreHistory: whether a marked publish reached the store, as a watcher of the key saw it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.client.statestore import SetResult
from agent.controller.points import SET_POINT
from agent.protocol.hlc import Hlc
from agent.sync.decisions import Synced
from agent.sync.history import StoreHistory
from agent.sync.record import PointRecord
from tests.support.examples import examples
from tests.sync.support import point_sync


def v(n: int) -> Hlc:
    return Hlc(1_700_000_000_000 + n, 0, "s")


def history_of(*changes: tuple[float, int], kept: int = 64) -> StoreHistory:
    history = StoreHistory(kept)
    for value, version in changes:
        history.saw(value, v(version))
    return history


def test_a_publish_seen_between_its_token_and_its_record_reached_the_store() -> None:
    history = history_of((20.0, 1), (16.5, 4), (23.0, 6))
    assert history.reached_store(16.5, v(3), v(5), v(1)) is True


def test_a_publish_not_seen_by_a_whole_watch_never_did() -> None:
    """The soak's case: the remote change 20.0 (with the renewal's version) came first, the
    store refused 16.5, the record was written at 5, and 23.0 came after it."""
    history = history_of((18.0, 1), (20.0, 4), (23.0, 6))
    assert history.reached_store(16.5, v(3), v(5), v(1)) is False


def test_the_same_value_outside_the_window_is_not_the_publish() -> None:
    history = history_of((16.5, 2), (20.0, 4), (16.5, 6))
    assert history.reached_store(16.5, v(3), v(5), v(1)) is False


def test_a_gap_in_the_watch_after_the_record_leaves_it_unknown() -> None:
    history = history_of((20.0, 4), (23.0, 6))
    assert history.reached_store(16.5, v(3), v(5), v(6)) is None  # caught up at 6
    assert history.reached_store(16.5, v(3), v(5), None) is None  # not caught up yet
    assert history.reached_store(16.5, None, v(5), v(1)) is None  # a record without token
    assert history_of((23.0, 6)).reached_store(16.5, v(3), v(5), v(4)) is None  # 4 unseen


def test_caught_up_between_the_token_and_the_record_on_another_value_it_never_did() -> None:
    """A 30-minute soak's lost panel change: the active's link slowed, its publish of 16.5
    (token 3) reached the store after a remote change of 20.0 (version 4, fenced with a
    renewal's newer token) and was refused; the connection dropped before the answer. It
    caught up at 4 (20.0), the record was at 5, a remote change 23.0 came at 6, and it took
    the line again: the key held 20.0 when the record was written, not 16.5."""
    history = history_of((20.0, 4), (23.0, 6))
    assert history.reached_store(16.5, v(3), v(5), v(4)) is False
    # Had it been taken after 20.0 (4, counter 1), the watch from 4 on would have seen it.
    taken = history_of((20.0, 4))
    taken.saw(16.5, Hlc(v(4).wall_ms, 1, "s"))
    taken.saw(23.0, v(6))
    assert taken.reached_store(16.5, v(3), v(5), v(4)) is True


def test_changes_dropped_to_keep_the_bound_leave_it_unknown() -> None:
    history = history_of((18.0, 1), (19.0, 4), (20.0, 6), (21.0, 7), kept=2)
    assert history.reached_store(16.5, v(3), v(5), v(1)) is None
    assert history.reached_store(16.5, v(6), v(8), v(1)) is False


@pytest.mark.thorough
@settings(max_examples=examples(1000, 200), deadline=None)
@given(
    writes=st.lists(st.sampled_from([16.5, 20.0, 23.0]), max_size=12),
    accepted=st.booleans(),
    where=st.integers(0, 12),
    token_at=st.integers(0, 12),
    watch_from=st.integers(0, 26),
    kept=st.integers(1, 16),
)
def test_never_wrong_only_unsure(
    writes: list[float], accepted: bool, where: int, token_at: int, watch_from: int, kept: int
) -> None:
    """Remote writes, and the publish of 16.5 at `where` (taken or refused) right before its
    record, sent with a token from before the `token_at`th write (the network held the
    publish back while remote writes landed); the watcher saw every change from
    `watch_from` on and kept the last `kept`: its answer is the truth, or None (or True
    when a remote write of 16.5 itself landed between the token and the record)."""
    where = min(where, len(writes))
    token_at = min(token_at, where)
    token = v(2 * token_at)
    store: list[tuple[float, int]] = [(value, 2 * i + 1) for i, value in enumerate(writes[:where])]
    clock = 2 * where
    if accepted:
        clock += 1
        store.append((16.5, clock))
    record = clock + 1
    clock = record
    for value in writes[where:]:
        clock += 2
        store.append((value, clock))
    history = StoreHistory(kept)
    seen = [(value, version) for value, version in store if version > watch_from]
    for value, version in seen:
        history.saw(value, v(version))
    answer = history.reached_store(16.5, token, v(record), v(watch_from))
    same_value_meanwhile = any(
        value == 16.5 and 2 * token_at < version < record for value, version in store
    )
    assert answer in (accepted, None) or (answer is True and same_value_meanwhile)
    seen_before_record = any(version < record for _, version in seen)
    if len(seen) <= kept and (watch_from <= 2 * token_at or seen_before_record):
        # Watched whole since before the token, or since a change before the record: sure.
        assert answer is accepted or (answer is True and same_value_meanwhile)


class StoreAfterTheRemoteChange:
    """The store when the new active takes over: 23.0 (a remote change after the record),
    fenced as it is; every change of the key watched since version 1."""

    token = v(9)

    def __init__(self) -> None:
        self.bulk = asyncio.Semaphore(64)

    async def get(self, key: str, **_: Any) -> tuple[bytes | None, Hlc | None]:
        return b"23.0", v(6)

    async def fenced_set(self, key: str, value: bytes, **_: Any) -> SetResult:
        return SetResult(True, v(10))

    def delivered_since(self, key: str) -> Hlc | None:
        return v(1)


@pytest.mark.parametrize("accepted", [True, False])
async def test_a_takeover_counts_the_marked_publish_as_it_saw_the_key(
    tmp_path: Path, accepted: bool
) -> None:
    """The soak's two lost panel changes, at the point: the former active published 16.5
    with token 3 and marked its record (version 5); a remote change with the version of a
    renewal it had not heard of (4) came first, so the store refused 16.5; 23.0 came after
    the record. What the standby saw of the key tells that from 16.5 taken, then 23.0."""
    sync = point_sync(tmp_path, SET_POINT, StoreAfterTheRemoteChange())
    seen = [(b"18.0", 1), (b"20.0", 4), (b"23.0", 6)]
    if accepted:
        seen.insert(2, (b"16.5", 5))  # in the store right before the record
        seen[3:] = [(b"23.0", 7)]
    for raw, version in seen:
        sync.past.history.saw(float(raw), v(version))
    entry = PointRecord(Synced(18.0, v(1)), published=16.5, published_after=v(3))
    marked_at = v(6) if accepted else v(5)
    await sync.take_over(object(), entry, marked_at)  # type: ignore[arg-type]
    # Refused: the controller's 16.5 is a panel change still to publish.
    assert sync.past.published == (16.5 if accepted else None)


class FencedStore(StoreAfterTheRemoteChange):
    """The same store, keeping what is written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[tuple[str, bytes]] = []

    async def fenced_set(self, key: str, value: bytes, **_: Any) -> SetResult:
        self.written.append((key, value))
        return SetResult(True, v(10))


@pytest.mark.parametrize("accepted", [True, False])
async def test_a_takeover_that_finds_the_marked_publish_refused_says_so_in_the_store_at_once(
    tmp_path: Path, accepted: bool
) -> None:
    """The 15-minute soak's lost panel change: this instance took over, found the former
    active's publish of 16.5 refused, and was frozen before its next record; the fences it
    had sent rewrote the key after the record, so that the next active, which had not seen
    the key before them, took the marker for an accepted publish and the key's 19.5 for a
    remote change after it, and wrote it over the panel change."""
    store = FencedStore()
    sync = point_sync(tmp_path, SET_POINT, store)
    seen = [(b"18.0", 1), (b"20.0", 4), (b"23.0", 6)]
    if accepted:
        seen.insert(2, (b"16.5", 5))
        seen[3:] = [(b"23.0", 7)]
    for raw, version in seen:
        sync.past.history.saw(float(raw), v(version))
    sync.record.update("setPoint", Synced(18.0, v(1)), (), published=16.5)
    entry = PointRecord(Synced(18.0, v(1)), published=16.5, published_after=v(3))
    await sync.take_over(object(), entry, v(6) if accepted else v(5))  # type: ignore[arg-type]
    records = [value for key, value in store.written if key == "t01\\synced"]
    if accepted:
        assert records == [], "the record written before the takeover decided"
    else:
        assert records, "the refusal was not said in the store"
        assert b"16.5" not in records[-1], records[-1]
