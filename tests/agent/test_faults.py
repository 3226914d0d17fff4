"""Faults at the worst moment, checked against the pair's invariants: one master on the line,
the newest token on every accepted write."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.soak.checker import StoreEvent
from tests.support.rig import ACTIVE, STANDBY, STEPPED_DOWN, LineRig
from tests.support.store_watch import watch_writes


class StoreWatch:
    """Every write the store handles, in its own order."""

    def __init__(self, rig: LineRig) -> None:
        self.writes: list[StoreEvent] = []
        watch_writes(rig.store.store, self.writes.append)


@pytest.fixture
def line(tmp_path: Path) -> Iterator[LineRig]:
    rig = LineRig(tmp_path, 4)
    try:
        yield rig
    finally:
        rig.close()


def test_a_paused_active_resumed_after_two_leases_drives_nothing(line: LineRig) -> None:
    watch = line.background.call(lambda: StoreWatch(line))
    old, _ = line.start_active("a")
    new = line.start_agent("b")
    new.wait_for_new(STANDBY)
    line.wait_store({1: b"20.0"})
    old.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    new.wait_for_new(ACTIVE, timeout=10)
    # The new active writes with its newer token: a panel change it publishes.
    line.background.call(lambda: line.unit(2).panel_setpoint(18.5))
    line.wait_store({2: b"18.5"})
    while time.monotonic() < stopped_at + 2 * line.ttl_ms / 1000:
        time.sleep(0.05)  # the fault is the pause itself: two leases long
    resumed_at = time.monotonic()
    old.signal(signal.SIGCONT)
    old.wait_for_new(STEPPED_DOWN, timeout=10)
    line.remote_set_device(3, b"23.0")
    line.wait_line(lambda fake: fake.unit(3).setpoint == 23.0)

    # The line: after it resumed, the former active sent not a single frame.
    records = line.background.call(lambda: list(line.device.records))
    clients = sorted(
        {r.client for r in records}, key=lambda c: min(r.at for r in records if r.client == c)
    )
    old_client, new_client = clients[0], clients[-1]
    assert old_client != new_client
    assert not [r for r in records if r.client == old_client and r.at >= resumed_at]
    assert not [r for r in records if r.other_client is not None]  # no collision
    # The store: nothing of the former active's was accepted after it resumed.
    old_writes = [w for w in watch.writes if w.client.endswith("-a") and w.at >= resumed_at]
    assert not [w for w in old_writes if w.accepted and not w.key.endswith(b"lock")], old_writes
