from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.controller.fake_device import FakeDevice


@pytest.fixture
async def device(tmp_path: Path) -> AsyncIterator[FakeDevice]:
    """The fake controller on a pty (a symlink in tmp_path), TCP and a panel."""
    fake = FakeDevice()
    await fake.start(pty_link=tmp_path / "ttyFAKE", tcp_port=0, panel_port=0)
    try:
        yield fake
    finally:
        await fake.stop()
