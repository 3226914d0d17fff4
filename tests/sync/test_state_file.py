from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from agent.protocol.hlc import Hlc
from agent.sync.decisions import Synced
from agent.sync.state_file import StateFile


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
