"""A remote value is judged against the unit's limits, read before the decision. A 30-minute
soak: the unit left the line (unplugged) between that read and the decision, its limits
forgotten with it, and the remote value was refused for want of limits; the key got the
unit's value back, over the remote change. Nothing is decided then: the unit back, the
change is decided on again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.client.statestore import KeyChange, SetResult
from agent.controller.interface import ControllerState, Limits
from agent.controller.points import SET_POINT
from agent.protocol.hlc import Hlc
from agent.sync.decisions import Rules, Synced
from agent.sync.point import PointSync
from tests.sync.support import point_sync


def v(n: int) -> Hlc:
    return Hlc(1_700_000_000_000 + n, 0, "s")


class Store:
    def __init__(self) -> None:
        self.token = v(0)
        self.writes: list[tuple[str, bytes]] = []

    async def fenced_set(self, key: str, value: bytes, **_: Any) -> SetResult:
        self.writes.append((key, value))
        return SetResult(True, v(9))


class LeavingUnit:
    """Answers a read of its state and of its limits, and leaves the line right after: its
    limits are forgotten (agent.line.handle: read again when it is back)."""

    last_state = None
    last_state_at = None
    last_write_at = None
    limits: Limits | None = None

    async def read_state(self) -> ControllerState:
        return ControllerState(24.0, 21.0, None, None)

    async def read_limits(self) -> Limits:
        return Limits(5.0, 35.0, 0.5)  # and gone: self.limits stays None


def with_limits_of(unit: LeavingUnit) -> Any:
    return lambda state: Rules(SET_POINT, unit.limits)


async def test_a_remote_value_is_not_refused_for_limits_the_unit_took_away(
    tmp_path: Path,
) -> None:
    store = Store()
    sync: PointSync = point_sync(tmp_path, SET_POINT, store)
    unit = LeavingUnit()
    sync._rules = with_limits_of(unit)
    sync.controller = unit  # type: ignore[assignment]
    sync.status.synced = Synced(24.0, v(1))
    change = KeyChange(b"t01\\setPoint", "SET", b"15.5", v(5))
    await sync.on_remote_change(change)
    assert store.writes == []  # neither the unit's 24.0 written back nor a refusal recorded
    assert sync.status.counters.invalid_remote_values == 0
