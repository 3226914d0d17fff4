"""What `agent status` shows after faults is true: a frozen former active is not
responding and the lock's holder decides the verdict; `--watch` rides out a broker outage."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.ops.support import Topics, command, health_topic, status, wait_in_sync, wait_pair
from tests.support.processes import AgentProcess
from tests.support.rig import ACTIVE, STANDBY, LineRig, Rig

LINE = LineRig.LINE


def status_until(line: Rig, predicate: Any, timeout: float = 15.0) -> dict[str, Any]:
    """`agent status --json` until its report satisfies `predicate` (the heartbeat of a
    frozen process goes stale with nothing to wait on but time: the view is asked again)."""
    deadline = time.monotonic() + timeout
    while True:
        _, document = status(line, LINE, "--force")  # asked before the agents first report
        (report,) = document["lines"]
        if predicate(report):
            return report
        assert time.monotonic() < deadline, report
        time.sleep(0.5)


def test_a_frozen_active_reads_as_not_responding_beside_the_new_active(
    line: LineRig, topics: Topics
) -> None:
    first, _ = line.start_active("a")
    second = line.start_agent("b")
    second.wait_for_new(STANDBY)
    wait_pair(topics, LINE, "a", "b")
    first.signal(signal.SIGSTOP)
    try:
        second.wait_for_new(ACTIVE, timeout=15)
        report = status_until(
            line, lambda r: r["holder"] == "b" and r["instances"][1]["role"] == "not responding"
        )
        rows = {r["instance"]: (r["role"], r["state"]) for r in report["instances"]}
        assert rows["b"] == ("active", "running")
        assert re.fullmatch(r"heard \d+(\.\d)? s ago", rows["a"][1]), rows
        (problem,) = [p for p in report["problems"] if p.startswith("a ")]
        assert re.fullmatch(r"a is not responding \(last heard \d+(\.\d)? s ago\)", problem)
        assert "no standby" not in report["problems"], report["problems"]
        table = command(line, "status", LINE).stdout
        assert re.search(r"\| a +\| not responding +\| heard \d", table), table
    finally:
        first.signal(signal.SIGCONT)
    # Thawed, it learns it lost the lease and stands by: the pair is whole again.
    topics.wait(health_topic(LINE, "a"), lambda d: d.get("role") == "standby", timeout=15)
    status_until(line, lambda r: r["code"] == 0 or r["problems"] == [])


@pytest.mark.slow
def test_watch_rides_out_a_broker_outage(line: LineRig, topics: Topics) -> None:
    line.start_active("a")
    line.start_agent("b").wait_for_new(STANDBY)
    wait_pair(topics, LINE, "a", "b")
    wait_in_sync(topics, line.device_ids)
    args = ["status", LINE, "--watch", "--interval", "0.5", "--port", str(line.port)]
    watch = AgentProcess([*args, "--host", "127.0.0.1"], merge_stderr=True)
    try:
        watch.wait_for_new(re.compile(r"Status: ok \(exit 0\)"), timeout=15)
        topics.close()
        line.broker_down()
        watch.wait_for_new(
            re.compile(r"The broker is unreachable since \d\d:\d\d:\d\d \(\d"), timeout=10
        )
        watch.wait_for_new(re.compile(r"Status: unknown: no broker \(exit 4\)"), timeout=5)
        watch.wait_for_new(re.compile(r"The broker is unreachable since"), timeout=5)  # still on
        assert watch.proc.poll() is None
        line.broker_up()
        watch.wait_for_new(re.compile(r"Status: ok \(exit 0\)"), timeout=20)
        watch.signal(signal.SIGINT)
        assert watch.proc.wait(10) == 0
        assert "Traceback" not in "".join(watch.lines)
    finally:
        watch.stop()


def test_a_cold_start_is_taking_over_not_silent(tmp_path: Path) -> None:
    """On a store that kept nothing, the first holder waits out a lease before it drives."""
    rig = LineRig(tmp_path, 2, served_before=False)
    try:
        # A wait of 9 s, looked at once it has begun: a loaded machine's `agent status`
        # took most of a 5 s one to start and report.
        first = rig.start_agent("a", AGENT_LOCK__TTL_MS="9000")
        first.wait_for(re.compile(r"holding the lock; waiting"), timeout=30)
        report = status_until(
            rig, lambda r: r["holder"] == "a" and r["instances"][0]["state"] == "taking over"
        )
        (said,) = [p for p in report["problems"] if p != "no standby"]  # none started
        assert re.fullmatch(
            r"a taking over: waiting for the previous lease to end \(\d\.\d s left\)", said
        ), said
        first.wait_for(ACTIVE, timeout=20)
    finally:
        rig.close()


def test_a_standby_that_cannot_take_over_is_said(line: LineRig, topics: Topics) -> None:
    line.start_active("a")
    line.start_agent("b", AGENT_SERIAL__URL="/dev/ttyNOPE0")
    wait_pair(topics, LINE, "a", "b")
    report = status_until(line, lambda r: r["instances"][1]["state"] == "not ready")
    assert report["code"] == 5
    (said,) = [p for p in report["problems"] if not p.endswith("no status reported")]
    assert said.startswith("b cannot take over: ") and "/dev/ttyNOPE0" in said, said
