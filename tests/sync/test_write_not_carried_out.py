"""A remote change whose write to the unit was not carried out (no reply to the read that
guards it, the write never sent) is decided again at the unit's next reading. It was left
pending and nothing asked again: the unit's next readings held the synced value, which is no
news, and the store kept the remote change while the unit kept its old value to the end (a
5-minute soak of 32 whole thermostats, seed 4321: a unit late for one reply)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent.client.statestore import KeyChange
from agent.controller.interface import (
    ControllerState,
    ControllerUnavailable,
    Limits,
    NotSent,
)
from agent.controller.points import SET_POINT
from agent.sync.decisions import Rules, Synced
from tests.sync.support import KeyStore, point_sync, v


def at(setpoint: float) -> ControllerState:
    return ControllerState(setpoint, 21.0, None, None)


class LateOnce:
    """Holds 24.5; its first write fails the way `fault` says, the next goes through."""

    last_state: ControllerState | None = None
    last_state_at: float | None = None
    last_write_at: float | None = None
    limits: Limits | None = Limits(5.0, 35.0, 0.5)

    def __init__(self, fault: Exception) -> None:
        self.fault: Exception | None = fault
        self.setpoint = 24.5
        self.written: list[object] = []
        self.wrote = asyncio.Event()

    async def read_state(self) -> ControllerState:
        return at(self.setpoint)

    async def read_limits(self) -> Limits:
        return Limits(5.0, 35.0, 0.5)

    async def write_point(self, point: str, value: object, **_: Any) -> object:
        if self.fault is not None:
            fault, self.fault = self.fault, None
            raise fault
        self.written.append(value)
        self.setpoint = float(value)  # type: ignore[arg-type]
        self.wrote.set()
        return value


@pytest.mark.parametrize(
    "fault",
    [
        ControllerUnavailable("no reply to '@7 GET POINTS' within 0.41 s"),
        NotSent("'@7 GET POINTS': not sent (the lease would not cover it)"),
    ],
    ids=["unanswered", "not sent"],
)
async def test_a_write_not_carried_out_is_decided_again_at_the_next_reading(
    tmp_path: Path, fault: Exception
) -> None:
    sync = point_sync(tmp_path, SET_POINT, KeyStore(b"19.0"))
    sync._rules = lambda state: Rules(SET_POINT, Limits(5.0, 35.0, 0.5))  # type: ignore[method-assign]
    unit = LateOnce(fault)
    sync.controller = unit  # type: ignore[assignment]
    sync.status.synced = Synced(24.5, v(1))
    sync.reconciled.set()
    await sync.on_remote_change(KeyChange(b"t01\\setPoint", "SET", b"19.0", v(5)))
    assert unit.written == []
    # The unit's next routine reading holds the synced value: news all the same.
    assert sync.wants(at(24.5)), "the reading after the write not carried out is no news"
    sync.start()
    try:
        sync.polled(at(24.5), 0.0)
        await asyncio.wait_for(unit.wrote.wait(), 5)
        async with sync._busy:  # the operation that wrote has ended
            assert unit.written == [19.0]
            assert sync.status.synced == Synced(19.0, v(5))
            assert not sync.wants(at(19.0))
    finally:
        await sync.stop()
