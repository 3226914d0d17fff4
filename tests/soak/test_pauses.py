"""The soak measures its own pauses: a stalled store loop and a long collection show in its
report, and what it keeps is moved out of the collector's sight."""

from __future__ import annotations

import gc
import time

from tests.soak.pauses import Pauses
from tests.soak.world import wait_until
from tests.support.rig import BackgroundLoop


def until(condition: object) -> bool:
    return wait_until(condition, 5.0, step=0.005) is not None


def test_a_stalled_store_loop_and_a_collection_are_reported() -> None:
    background = BackgroundLoop()
    pauses = Pauses(freeze_every_s=0.01)
    frozen_before = gc.get_freeze_count()
    try:
        pauses.start(background.loop)
        assert until(lambda: pauses._probe is not None)  # the probe runs on the loop
        background.call(lambda: time.sleep(0.3))  # the loop can run nothing else meanwhile
        assert until(lambda: pauses.longest_loop_stall_s >= 0.2)
        assert pauses.report()["harness: store event loop stalls over 100 ms"] >= 1
        kept = [[n] for n in range(1000)]  # something to keep, in the collector's sight
        assert until(lambda: gc.get_freeze_count() > frozen_before + len(kept) // 2)
        gc.collect()
        assert pauses.longest_gc_s > 0
    finally:
        pauses.stop()
        background.close()
        gc.unfreeze()
    assert pauses._on_gc not in gc.callbacks
