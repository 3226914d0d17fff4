from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.mosquitto import Mosquitto, mosquitto_binary


@pytest.fixture
def mosquitto() -> Iterator[Mosquitto]:
    """A fresh mosquitto on a free port. Skipped where it is not installed, except in CI."""
    if mosquitto_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("mosquitto is required in CI")
        pytest.skip("mosquitto is not installed")
    broker = Mosquitto()
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
