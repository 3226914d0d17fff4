"""A heating and a cooling set point changed in one burst are one change.

Raising both (heat 20 -> 25, cool 24 -> 27, a deadband of 1) keeps the deadband, but each
key judged alone against the unit as it is does not: heat 25 beside the unit's cool 24 is
refused, cool 27 applied, and the unit ends at 20 / 27, which nobody asked for. So a change
of either that breaks the deadband against the unit's other set point waits up to
`BURST_S` for a change of the other key. When one comes, the two are judged together (each
against the other's new value: both go, or both are refused) and written in the order that
keeps the unit's own deadband at every step (cool first when raising, heat first when
lowering). When none comes, the change is judged alone, and refused as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from agent.client.statestore import KeyChange
from agent.controller.interface import ControllerState
from agent.controller.points import check_deadband, point
from agent.sync.decisions import parsed
from agent.sync.point import PointSync

HEAT, COOL = "heatSetPoint", "coolSetPoint"
OTHER = {HEAT: COOL, COOL: HEAT}
BURST_S = 0.5
"""How long a change that breaks the deadband alone waits for the other key's change."""


def first_to_write(unit_heat: float | None, cool: float, least: float) -> str:
    """Which set point of a new pair goes to the unit first, so that the unit holds a pair
    that keeps the deadband after each write: cool, unless the new cool beside the unit's
    heat would break it; then heat (lowered first, it makes room). When the unit's pair
    and the new one keep the deadband, one of the two orders always does."""
    if unit_heat is None or check_deadband(unit_heat, cool, least) is None:
        return COOL
    return HEAT


@dataclass(frozen=True, slots=True)
class _Held:
    name: str
    change: KeyChange
    value: float
    arrived: float


class SetPointPair:
    """The heating and cooling set points of one device, their changes in a burst judged
    as one (see the module)."""

    def __init__(
        self,
        syncs: Mapping[str, PointSync],
        least: float,
        reading: Callable[[], ControllerState | None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._syncs = syncs
        self.least = least
        self._reading = reading
        self._spawn = spawn
        self._held: _Held | None = None
        self._alone: asyncio.TimerHandle | None = None
        self.judged_with: dict[str, float] = {}
        """While a pair is judged: both new values (each point's rules take the other's)."""

    def arrived(self, name: str, change: KeyChange) -> bool:
        """A change of heat's or cool's key, while active. True if it is taken here (held
        for the other's, or judged with it); False: the point handles it as any."""
        value = parsed(point(name), change.value)
        if not isinstance(value, float) or change.version is None:
            return False
        held = self._held
        now = time.monotonic()
        if held is not None and held.name != name:
            self._release()
            self._spawn(self._both(held, _Held(name, change, value, now)))
            return True
        if held is None and not self._breaks_alone(name, value):
            return False
        self._release()
        self._held = _Held(name, change, value, now)
        self._alone = asyncio.get_running_loop().call_later(BURST_S, self._judge_alone)
        return True

    def _breaks_alone(self, name: str, value: float) -> bool:
        state = self._reading()
        other = None if state is None else state.value(OTHER[name])
        if not isinstance(other, float):
            return False
        heat, cool = (value, other) if name == HEAT else (other, value)
        return check_deadband(heat, cool, self.least) is not None

    def _release(self) -> None:
        if self._alone is not None:
            self._alone.cancel()
        self._alone, self._held = None, None

    def _judge_alone(self) -> None:
        held = self._held
        self._alone, self._held = None, None
        if held is not None:
            self._syncs[held.name].remote_changed(held.change)

    async def _both(self, a: _Held, b: _Held) -> None:
        new = {a.name: a, b.name: b}
        state = self._reading()
        unit_heat = None if state is None else state.value(HEAT)
        first = first_to_write(
            unit_heat if isinstance(unit_heat, float) else None, new[COOL].value, self.least
        )
        self.judged_with = {name: held.value for name, held in new.items()}
        try:
            for name in (first, OTHER[first]):
                held = new[name]
                await self._syncs[name].on_remote_change(held.change, held.arrived)
        finally:
            self.judged_with = {}
