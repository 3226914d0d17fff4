"""A remote change is decided on the unit's newest reading even when it was taken before the
change arrived, if the decision is a write: the bus reads the unit right before the write
goes out and sends it only if the unit still holds what the decision saw, so the read a
decision would take first is the same transaction one hop sooner. Any other decision made
on such a reading is made again on a fresh one: the unit may have been changed at its
panel since, and a value it no longer holds must not be published over the change."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agent.client.statestore import KeyChange
from agent.controller.interface import ControllerState, Limits
from agent.controller.points import SET_POINT
from agent.sync.decisions import Rules, Synced
from tests.sync.support import KeyStore, point_sync, v

LIMITS = Limits(5.0, 35.0, 0.5)


def at(setpoint: float) -> ControllerState:
    return ControllerState(setpoint, 21.0, None, None)


class Unit:
    """Last read holding `read_before` (before the change arrived); holds `holds` now."""

    limits: Limits | None = LIMITS
    last_write_at: float | None = None

    def __init__(self, read_before: float, holds: float, read_at: float) -> None:
        self.last_state: ControllerState | None = at(read_before)
        self.last_state_at: float | None = read_at
        self.setpoint = holds
        self.reads = 0
        self.writes: list[tuple[object, dict[str, Any]]] = []

    async def read_state(self) -> ControllerState:
        self.reads += 1
        self.last_state, self.last_state_at = at(self.setpoint), time.monotonic()
        return self.last_state

    async def read_limits(self) -> Limits:
        return LIMITS

    async def write_point(self, point: str, value: object, **options: Any) -> object:
        self.writes.append((value, options))
        self.setpoint = float(value)  # type: ignore[arg-type]
        return value


def published(store: KeyStore) -> list[tuple[str, bytes]]:
    """The writes of the point's key (not of the sync record)."""
    return [(key, value) for key, value in store.writes if not key.endswith("synced")]


async def change_after(tmp_path: Path, unit: Unit, arrived: float) -> KeyStore:
    store = KeyStore(b"22.0")
    sync = point_sync(tmp_path, SET_POINT, store)
    sync._rules = lambda state: Rules(SET_POINT, LIMITS)  # type: ignore[method-assign]
    sync.controller = unit  # type: ignore[assignment]
    sync.status.synced = Synced(20.0, v(1))
    sync.reconciled.set()
    await sync.on_remote_change(KeyChange(b"t01\\setPoint", "SET", b"22.0", v(5)), arrived)
    return store


async def test_a_write_decided_on_an_older_reading_is_left_to_the_read_before_it(
    tmp_path: Path,
) -> None:
    arrived = time.monotonic()
    unit = Unit(read_before=20.0, holds=20.0, read_at=arrived - 0.05)
    store = await change_after(tmp_path, unit, arrived)
    assert unit.reads == 0, "read before deciding, though the write reads the unit itself"
    [(value, options)] = unit.writes
    assert value == 22.0
    # The bus reads the unit right before the write, and sends it only if it holds 20.0.
    assert options["expected"] == 20.0
    assert options["fresh_after"] == arrived
    assert published(store) == []


async def test_any_other_decision_on_an_older_reading_is_made_again_on_a_fresh_one(
    tmp_path: Path,
) -> None:
    # Read holding 21.0 (a panel change), then turned back to 20.0 at the panel before the
    # remote change came: on the old reading the panel change crossed the remote one and
    # 21.0 would be published over 22.0, a value the unit no longer holds.
    arrived = time.monotonic()
    unit = Unit(read_before=21.0, holds=20.0, read_at=arrived - 0.05)
    store = await change_after(tmp_path, unit, arrived)
    assert unit.reads == 1
    assert [value for value, _ in unit.writes] == [22.0]
    assert published(store) == [], "a value the unit held before the change was published"
