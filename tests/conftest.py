from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from agent.simulator.device import FakeDevice
from tests.support.mosquitto import Mosquitto, mosquitto_binary
from tests.support.processes import LIVE
from tests.support.store_backends import EmbeddedBackend, MosquittoBackend, StoreBackend

# CI explores the same examples on every run (a new example that fails shows up locally,
# where the search is random, not as a CI run that fails once).
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """A failed test that ran agent processes shows what each of them said last."""
    report = yield
    if call.when == "call" and report.failed:
        for process in list(LIVE):
            report.sections.append(("agent process output", process.tail()))
    if call.when == "teardown":
        LIVE.clear()
    return report


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


@pytest.fixture
async def device(tmp_path: Path) -> AsyncIterator[FakeDevice]:
    """The fake controller on a pty (a symlink in tmp_path), TCP and a panel."""
    fake = FakeDevice()
    await fake.start(pty_link=tmp_path / "ttyFAKE", tcp_port=0, panel_port=0)
    try:
        yield fake
    finally:
        await fake.stop()
