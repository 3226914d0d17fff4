from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from agent.protocol.hlc import Hlc
from agent.sync import state_file
from agent.sync.decisions import Synced
from agent.sync.state_file import LaterSaves, StateFile


def test_round_trip_and_atomic_replace(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "state", "thermostat-1")
    assert state.load() == Synced()
    synced = Synced(21.5, Hlc(1_700_000_000_000, 3, "statestore"))
    state.save(synced)
    assert state.load() == synced
    state.save(Synced(22.0, None))
    assert state.load() == Synced(22.0, None)
    assert os.listdir(tmp_path / "state") == ["thermostat-1.synced.json"]  # no temp files


def test_damaged_file_is_ignored(tmp_path: Path) -> None:
    state = StateFile(tmp_path, "d")
    for content in ("", "{", "[]", '{"value": "x"}', '{"value": 1, "version": "bad"}'):
        state.path.write_text(content)
        assert state.load() == Synced()


async def test_store_writes_off_the_event_loop_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = StateFile(tmp_path, "d")
    loop_thread = threading.get_ident()
    fsync_threads: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        fsync_threads.append(threading.get_ident())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    versions = [Synced(20.0 + n, Hlc(1_700_000_000_000 + n, 0, "s")) for n in range(10)]
    await asyncio.gather(*(state.store(synced) for synced in versions))
    assert state.load() == versions[-1]
    assert fsync_threads and loop_thread not in fsync_threads


@pytest.mark.parametrize(
    ("point", "value"),
    [
        ("mode", "cool"),
        ("fan", "high"),
        ("occupied", True),
        ("occupied", False),
        ("heatSetPoint", 19.5),
    ],
)
def test_every_point_comes_back_as_its_kind(tmp_path: Path, point: str, value: object) -> None:
    """A restarted instance reads back what it last synced of each point: a mode read as a
    number was lost (the file ignored), and occupancy came back as 1.0, which the next
    takeover refused in the sync record, and with it the base of every point."""
    version = Hlc(5, 0, "n")
    file = StateFile(tmp_path, "t01.x", point)
    file.save(Synced(value, version), (Synced(value, version),))  # type: ignore[arg-type]
    again = StateFile(tmp_path, "t01.x", point)
    assert again.load() == Synced(value, version)  # type: ignore[arg-type]
    assert type(again.load().value) is type(value)
    assert again.load_pending() == (Synced(value, version),)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("point", "value"), [("mode", "warm"), ("occupied", 1.0), ("setPoint", "cool"), ("fan", 3)]
)
def test_a_value_not_of_the_points_kind_is_ignored_with_a_warning(
    tmp_path: Path, point: str, value: object, caplog: pytest.LogCaptureFixture
) -> None:
    file = StateFile(tmp_path, "t01.x", point)
    file.save(Synced(value, Hlc(5, 0, "n")))  # type: ignore[arg-type]
    assert file.load() == Synced()
    assert "ignoring unreadable state file" in caplog.text


def synced_at(n: int) -> Synced:
    return Synced(20.0 + n, Hlc(1_700_000_000_000 + n, 0, "s"))


async def test_syncs_saved_soon_wait_and_go_to_disk_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    later = LaterSaves(within_s=60)
    files = [StateFile(tmp_path, f"t{n:02d}", later=later) for n in range(10)]
    turns: list[int] = []
    real_save_all = state_file._save_all

    def counted(saves: list[Any]) -> None:
        turns.append(len(saves))
        real_save_all(saves)

    monkeypatch.setattr(state_file, "_save_all", counted)
    for n, file in enumerate(files):
        await file.store_soon(synced_at(n))
        await file.store_soon(synced_at(n + 100))  # the newest of a file's is what is saved
    assert not any(file.path.exists() for file in files), "saved at once"
    await later.close()
    assert turns == [10], "one worker thread's turn for every file due"
    assert [file.load() for file in files] == [synced_at(n + 100) for n in range(10)]


async def test_a_save_asked_later_is_never_written_over_by_an_earlier_one(tmp_path: Path) -> None:
    later = LaterSaves(within_s=60)
    file = StateFile(tmp_path, "t01", later=later)
    await file.store_soon(synced_at(1), (synced_at(2),))
    taken = file.take_later()  # the batch took it; its worker turn comes after the next save
    assert taken is not None
    await file.store(synced_at(3))  # a write's pending entry, saved at once
    file.save_state(taken)
    assert file.load() == synced_at(3)
    assert file.load_pending() == ()
    await file.store_soon(synced_at(4))
    await file.store(synced_at(5))  # supersedes the sync still waiting
    await later.close()
    assert file.load() == synced_at(5)


async def test_a_file_that_cannot_be_saved_leaves_the_others_saved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    later = LaterSaves(within_s=60)
    full = StateFile(tmp_path / "missing" / "unwritable", "t01", later=later)
    (tmp_path / "missing").write_text("a file where the directory should be")
    fine = StateFile(tmp_path, "t02", later=later)
    await full.store_soon(synced_at(1))
    await fine.store_soon(synced_at(2))
    await later.close()
    assert fine.load() == synced_at(2)
    assert "could not save the synced state" in caplog.text


async def test_without_a_batch_a_sync_is_saved_at_once(tmp_path: Path) -> None:
    file = StateFile(tmp_path, "t01")
    await file.store_soon(synced_at(1))
    assert file.load() == synced_at(1)
