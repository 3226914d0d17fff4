from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.mosquitto import Mosquitto, mosquitto_binary
from tests.support.store_backends import EmbeddedBackend, MosquittoBackend, StoreBackend


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


def _store_kinds() -> list[str]:
    kinds = ["embedded"]
    if mosquitto_binary() is not None or os.environ.get("CI"):
        kinds.append("mosquitto")
    return kinds


@pytest.fixture(params=_store_kinds())
async def store_backend(request: pytest.FixtureRequest) -> AsyncIterator[StoreBackend]:
    """A state store in this process: embedded, or served on a fresh mosquitto."""
    backend: StoreBackend = EmbeddedBackend() if request.param == "embedded" else MosquittoBackend()
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()
