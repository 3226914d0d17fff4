from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.controller.fake_device import FakeDevice
from agent.controller.serial_driver import SerialController

# Small bounds so that the suite stays fast; the defaults are tested on their own.
FAST: dict[str, Any] = {
    "reply_timeout_s": 0.25,
    "min_write_interval_s": 0.2,
    "backoff_initial_s": 0.05,
    "backoff_max_s": 0.4,
}


@pytest.fixture
async def device(tmp_path: Path) -> AsyncIterator[FakeDevice]:
    """The fake controller on a pty (a symlink in tmp_path), TCP and a panel."""
    fake = FakeDevice()
    await fake.start(pty_link=tmp_path / "ttyFAKE", tcp_port=0, panel_port=0)
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
async def driver(device: FakeDevice) -> AsyncIterator[SerialController]:
    """The line-protocol driver on the fake device's pty."""
    assert device.pty_link is not None
    async with SerialController(device.pty_link, **FAST) as controller:
        assert controller.available
        yield controller
