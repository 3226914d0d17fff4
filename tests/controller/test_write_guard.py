"""A write can be withdrawn at the last moment: a lease holder whose lease ran out while
the driver waited out the write interval must not write."""

from __future__ import annotations

import time

import pytest

from agent.controller import WriteNotAllowed
from agent.controller.fake_device import FakeDevice
from agent.controller.serial_driver import SerialController


async def test_allowed_is_asked_after_the_write_interval(
    device: FakeDevice, driver: SerialController
) -> None:
    await driver.write_setpoint(21.0)
    asked_at: list[float] = []

    def allowed() -> bool:
        asked_at.append(time.monotonic())
        return False

    started = time.monotonic()
    with pytest.raises(WriteNotAllowed):
        await driver.write_setpoint(22.0, allowed=allowed)
    assert asked_at and asked_at[0] - started >= driver.min_write_interval_s * 0.9
    assert [w.value for w in device.writes] == [21.0]
    assert await driver.write_setpoint(22.0, allowed=lambda: True) == 22.0


async def test_not_asked_when_nothing_is_written(
    device: FakeDevice, driver: SerialController
) -> None:
    current = device.setpoint
    assert await driver.write_setpoint(current, allowed=lambda: False) == current
    assert device.writes == []
