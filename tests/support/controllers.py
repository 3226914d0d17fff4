"""One controller (or a few) on a bus, for tests that talk to a fake device."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from agent.controller.driver import Driver, Unit
from agent.controller.line_driver import LineDriver
from agent.line.bus import Bus, DeviceHandle

# Small bounds so that the suite stays fast; the defaults are tested on their own.
FAST_BUS: dict[str, Any] = {
    "poll_interval_s": 3600.0,  # no routine polls unless a test wants them
    "min_write_interval_s": 0.2,
    "backoff_initial_s": 0.05,
    "backoff_max_s": 0.4,
}


@contextlib.asynccontextmanager
async def one_controller(
    driver: Driver | str, unit: Unit | None = None, **bus_options: Any
) -> AsyncIterator[DeviceHandle]:
    """`async with one_controller(url) as controller:` a unit's handle on its own bus."""
    if isinstance(driver, str):
        driver = LineDriver(driver, reply_timeout_s=0.25)
    unit = unit or Unit("t1")
    async with Bus(driver, [unit], **{**FAST_BUS, **bus_options}) as bus:
        yield bus.device(unit.name)
