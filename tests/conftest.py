from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import FrameType

import pytest
from hypothesis import settings

from agent.simulator.device import FakeDevice
from tests.support.mosquitto import Mosquitto, mosquitto_binary
from tests.support.processes import LIVE
from tests.support.store_backends import EmbeddedBackend, MosquittoBackend, StoreBackend

# No per-example deadline: it is wall time, which a loaded machine reaches (an example that
# takes 0.3 s there fails as "too slow"); the test's timeout bounds the whole test instead.
settings.register_profile("local", deadline=None)
# CI explores the same examples on every run (a new example that fails shows up locally,
# where the search is random, not as a CI run that fails once).
settings.register_profile(
    "ci", parent=settings.get_profile("local"), derandomize=True, database=None
)
settings.load_profile("ci" if os.environ.get("CI") else "local")


TIMED_OUT = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: object) -> object:
    """Notes on the test that its timeout fired, before pytest-timeout raises in it."""
    handled = yield
    raise_timeout = signal.getsignal(signal.SIGALRM)
    if callable(raise_timeout):

        def fired(signum: int, frame: FrameType | None) -> None:
            item.stash[TIMED_OUT] = True
            raise_timeout(signum, frame)

        signal.signal(signal.SIGALRM, fired)
    return handled


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """A failed test that ran agent processes shows what each of them said last.

    A test whose timeout fired fails, whatever caught the timeout's exception on the way
    (Hypothesis takes it for a failing example and may replay it into a pass; code under
    test may swallow it).
    """
    report = yield
    timed_out = item.stash.get(TIMED_OUT, False)
    if timed_out:
        del item.stash[TIMED_OUT]  # the first report since it fired is the phase it cut
    if report.passed and timed_out:
        report.outcome = "failed"
        report.longrepr = f"its timeout fired during {call.when}, and the exception was caught"
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
