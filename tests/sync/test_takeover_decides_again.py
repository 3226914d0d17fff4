"""A takeover's write that finds the unit changed since the takeover read it decides again,
and the change it found is a panel change: this instance read the unit before it, so the
takeover's base (what the former active last had on the controller) stays the one it took
on the first reading. Taken anew on the changed reading, the base was a value the standby
had seen in the store long before (a write of the former active's that the unit happened to
hold again), and the store's older value was written over the panel change (a 5-minute soak
of 32 whole thermostats, a unit that answered garbage while the takeover's write waited)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.controller.interface import ControllerState, Limits, ReadingChanged
from agent.controller.points import FAN
from agent.sync.decisions import Rules, Synced
from tests.sync.support import KeyStore, point_sync, v


def fan(value: str) -> ControllerState:
    return ControllerState(21.0, 20.0, None, None, {"fan": value})


class TurnedAtThePanel:
    """Read at `auto`; turned to `on` at its panel before the takeover's write goes out,
    which the write's own check finds (nothing written)."""

    last_state: ControllerState | None = None
    last_state_at: float | None = None
    last_write_at: float | None = None
    limits: Limits | None = Limits(5.0, 35.0, 0.5)

    def __init__(self) -> None:
        self.written: list[object] = []

    async def read_state(self) -> ControllerState:
        return fan("auto")

    async def read_limits(self) -> Limits:
        return Limits(5.0, 35.0, 0.5)

    async def write_point(self, point: str, value: object, **_: Any) -> object:
        if not self.written:
            self.written.append(None)
            raise ReadingChanged("the fan is on now", fan("on"))
        self.written.append(value)
        return value


async def test_a_change_found_by_the_takeovers_write_is_published_not_written_over(
    tmp_path: Path,
) -> None:
    store = KeyStore(b"high")
    sync = point_sync(tmp_path, FAN, store)
    sync._rules = lambda state: Rules(FAN, None)  # type: ignore[method-assign]
    unit = TurnedAtThePanel()
    sync.controller = unit  # type: ignore[assignment]
    # While standby, the store held `on` (the former active's write, after its last
    # record); the record says it synced `auto`, which the unit holds at the takeover.
    sync.past.follow_value(b"on", v(3))
    sync.status.synced = Synced("auto", v(1))

    assert await sync._reconcile_at_takeover(Synced("auto", v(1)))

    assert [w for w in unit.written if w is not None] == [], "the store's high written over on"
    assert (b"t01\\fan", b"on") in [(key.encode(), value) for key, value in store.writes]
    assert sync.status.synced.value == "on"
