from __future__ import annotations

import os
from pathlib import Path

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
