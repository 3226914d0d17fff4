"""The pair over a slow link to the store, as real processes through a fault proxy: a start
counted in round trips, a start cut by outages, a lease taken again by its own holder, a
stepped-down instance that writes nothing after its lease."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.rig import STANDBY, LineRig

pytestmark = pytest.mark.slow

UNITS = 8
ONE_WAY_S = 0.2
ROUND_TRIP_S = 2 * ONE_WAY_S


@pytest.fixture
def line(tmp_path: Path) -> Iterator[LineRig]:
    rig = LineRig(tmp_path, UNITS)
    try:
        yield rig
    finally:
        rig.close()


def test_a_start_over_a_slow_link_takes_a_few_round_trips_whatever_the_line(
    line: LineRig,
) -> None:
    """A standby's start is its connection, its subscriptions, the lock and the control
    keys watched, and a contention: about six round trips, not two per key of the line
    (8 units, 19 keys: 43 round trips, 17 s at 0.2 s each way, when each key was watched
    in turn)."""
    line.start_active("a")
    standby = line.start_agent("b", via_proxy=True, link_delay_s=ONE_WAY_S)
    proxy = line.proxies["b"]
    standby.wait_for(STANDBY, timeout=30)
    ready = time.monotonic()
    connected = line.background.call(lambda: proxy.stats.connected_at[0])
    round_trips = (ready - connected) / ROUND_TRIP_S
    print(f"started as standby {round_trips:.1f} round trips after connecting")
    assert round_trips <= 8, f"started as standby {round_trips:.1f} round trips after connecting"
