"""A remote change whose read of the unit went unanswered once (a neighbour's late reply in
the way, a hiccup of the unit) is still applied: it was dropped until the next event, and
on a line where nothing else happened the unit kept its old set point for good."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.rig import LineRig


def test_a_remote_change_whose_read_timed_out_is_applied_after_all(tmp_path: Path) -> None:
    rig = LineRig(tmp_path, 2)
    try:
        active, _ = rig.start_active("a", AGENT_SERIAL__POLL_INTERVAL_S="30")
        # Unit 1 misses one read: its reply timeout is well under half a second here.
        rig.background.call(lambda: rig.unit(1).fault("SILENT", 0.4))
        started = time.monotonic()
        assert rig.remote_set_device(1, b"23.5") == b"+OK\r\n"
        rig.wait_line(lambda line: line.unit(1).setpoint == 23.5, timeout=5)
        assert time.monotonic() - started < 5  # not at the next poll, 30 s on
        active.drain()
    finally:
        rig.close()
