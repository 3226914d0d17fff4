"""`agent setpoint set --wait` on a line that cannot apply the value: said why, with an exit
code of its own, the value left in the store. What the agents would say is published by the
test (their retained health and the lock), so that nothing waits on an agent's start."""

from __future__ import annotations

import json
import time

from tests.ops.support import command, publish_retained, report
from tests.support.rig import LineRig

LINE = LineRig.LINE
EXIT_PAUSED, EXIT_DOWN = 6, 8


def served_by_a(line: LineRig) -> None:
    """Line floor3 as its active `a` leaves it in the store: the lock, each device's line."""
    report(line, LINE, "a", line.device_ids, role="active")
    assert line.client.request("SET", f"{LINE}\\lock", "a#0a1b2c3d").payload == b"+OK\r\n"
    for device in line.device_ids:
        assert line.client.request("SET", f"{device}\\line", LINE).payload == b"+OK\r\n"


def test_a_paused_line_is_said_at_once_by_whom_and_why(line: LineRig) -> None:
    served_by_a(line)
    note = {"by": "alice@gw1", "at": "2027-01-15T08:00:00Z", "reason": "new wiring"}
    assert line.client.request("SET", f"{LINE}\\paused", json.dumps(note)).payload == b"+OK\r\n"
    began = time.monotonic()
    written = command(line, "setpoint", "set", "t02", "22", "--wait", "20")
    assert written.returncode == EXIT_PAUSED, written.stderr
    assert time.monotonic() - began < 10  # not the 20 s of --wait
    assert written.stderr == (
        "agent setpoint: not applied yet: line floor3 is paused (new wiring, by alice@gw1, at "
        "2027-01-15T08:00:00Z): the value is in the store, and is applied when the line is "
        "resumed (agent resume floor3)\n"
    )
    assert line.setpoint_in_store(2) == b"22.0"


def test_a_unit_that_does_not_answer_is_said_when_the_wait_ends(line: LineRig) -> None:
    served_by_a(line)
    status = {"device": "t02", "instance": "a", "availability": "offline", "in_sync": False}
    publish_retained(line, "devices/t02/status", json.dumps(status).encode())
    written = command(line, "setpoint", "set", "t02", "22", "--wait", "0.2")
    assert written.returncode == EXIT_DOWN, written.stderr
    assert written.stderr.startswith(
        "agent setpoint: not applied yet: t02 is not answering on line floor3"
    )
    assert line.setpoint_in_store(2) == b"22.0"
