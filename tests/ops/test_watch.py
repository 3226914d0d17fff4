"""`agent watch`: the agents' health, device statuses and telemetry followed without
mosquitto-clients, one message a line; filtered, bounded, ended cleanly by Ctrl-C."""

from __future__ import annotations

import json
import re
import signal

from agent.message import Message
from agent.ops.watch_cli import shown
from tests.ops.support import Topics, command, publish_retained, report, wait_pair
from tests.support.processes import AgentProcess
from tests.support.rig import STANDBY, LineRig

LINE = LineRig.LINE


def test_a_message_stays_on_its_line_and_is_cut() -> None:
    assert shown(Message("a/b", b'{"x": 1}'), 100) == '[a/b] {"x": 1}'
    assert shown(Message("a/b", b"two\nlines\x00\xff"), 100) == "[a/b] two\\nlines\\x00\\xff"
    assert shown(Message("a/b", "température".encode()), 100) == "[a/b] température"
    assert shown(Message("a/b", b"x" * 50), 10) == "[a/b] xxxxxxxxxx… (50 bytes)"


def test_watch_follows_a_line_until_interrupted(line: LineRig, topics: Topics) -> None:
    line.start_active("a")
    line.start_agent("b").wait_for_new(STANDBY)
    wait_pair(topics, LINE, "a", "b")
    publish_retained(line, "devices/x99/status", b'{"device":"x99","line":"floor4"}')
    args = ["watch", LINE, "--port", str(line.port), "--host", "127.0.0.1"]
    watch = AgentProcess(args, merge_stderr=True)
    try:
        health = watch.wait_for(re.compile(r"^\[agents/floor3/b/health\] (\{.*\})$"))
        assert json.loads(health.group(1))["role"] == "standby"
        watch.wait_for(re.compile(r"^\[devices/t02/availability\] online$"))
        watch.wait_for(re.compile(r"^\[devices/t03/status\] \{.*\"line\":\"floor3\""))
        watch.wait_for(re.compile(r"^\[devices/t04/telemetry\] \{"), timeout=5)
        watch.wait_for(re.compile(r"^\[lines/floor3/telemetry\] \{"), timeout=5)
        watch.signal(signal.SIGINT)
        assert watch.proc.wait(10) == 0
    finally:
        watch.stop()
    said = "".join(watch.lines)
    assert "x99" not in said and "Traceback" not in said  # another line's device: not shown


def test_watch_filters_and_stops_after_count(line: LineRig) -> None:
    report(line, LINE, "a", ["t01"])
    report(line, "floor4", "c", ["t41"])
    only = command(line, "watch", "--kind", "health", "--count", "2", "--max-bytes", "40")
    assert only.returncode == 0, only.stderr
    rows = only.stdout.splitlines()
    assert sorted(row.split("]")[0] for row in rows) == [
        "[agents/floor3/a/health",
        "[agents/floor4/c/health",
    ]
    assert all(re.search(r"… \(\d+ bytes\)$", row) for row in rows), rows
    unknown = command(line, "watch", "floor5")
    assert unknown.returncode == 7 and "(did you mean floor3 or floor4?)" in unknown.stderr
    assert command(line, "watch", "--count", "0").returncode == 2
