"""A device configured on two lines: the line that serves it keeps it, the other leaves it
alone and says so, naming the device and both lines; neither line loses its lock (once,
each line's fenced writes refused the other's, and both lines flapped, every device with
them). A standby that could not take over says so before the active fails."""

from __future__ import annotations

import re
import time
from pathlib import Path

from agent.simulator.line import FakeLine
from tests.ops.support import Topics, health_topic
from tests.support.rig import STEPPED_DOWN, LineRig

OTHER_LINE = "floor4"
LEFT_ALONE = re.compile(r"device t02 is configured on line floor4 and on line floor3")


def test_a_device_on_two_lines_is_served_by_one_and_left_alone_by_the_other(
    tmp_path: Path,
) -> None:
    rig = LineRig(tmp_path, 2, ttl_ms=1500)
    other = FakeLine(units=2, setpoint=20.0, time_constant_s=30.0)
    rig.background.run(other.start(tcp_port=0))
    health = Topics(rig.port, health_topic(OTHER_LINE, "b"))
    try:
        first, _ = rig.start_active("a")
        second = rig.start_agent(
            "b",
            AGENT_LINE_ID=OTHER_LINE,
            AGENT_DEVICES="t02@1,t40@2",
            AGENT_SERIAL__URL=str(other.tcp_url),
            AGENT_HEALTH__INTERVAL_S="1",
        )
        second.wait_for_new(LEFT_ALONE, timeout=15)
        health.wait(
            health_topic(OTHER_LINE, "b"),
            lambda d: (
                d.get("conflicts") == [{"device": "t02", "line": "floor3"}]
                and "t02 (line floor3)" in (d.get("problem") or "")
            ),
        )
        # The line that serves t02 keeps serving it; the other serves its own device.
        assert rig.remote_set_device(2, b"24.5") == b"+OK\r\n"
        rig.wait_line(lambda line: line.unit(2).setpoint == 24.5)
        lock = rig.client.request("GET", f"{OTHER_LINE}\\lock")
        put = rig.client.request("SET", "t40\\setPoint", b"23.0", ft=lock.prop("__ts"))
        assert put.payload == b"+OK\r\n"
        rig.background.run(other.wait_for(lambda: other.unit(2).setpoint == 23.0, 10), 15)
        # Nobody touched t02 on floor4's line, and neither line lost its lock.
        assert other.unit(1).writes == []
        time.sleep(2)  # a few renewals and polls: nothing flaps meanwhile
        for process in (first, second):
            process.drain()
            assert not any(STEPPED_DOWN.search(t) for t in process.lines), process.lines
        assert rig.remote_set_device(2, b"25.5") == b"+OK\r\n"
        rig.wait_line(lambda line: line.unit(2).setpoint == 25.5)
    finally:
        health.close()
        rig.background.run(other.stop())
        rig.close()


def test_a_standby_that_could_not_take_over_is_a_problem_before_the_active_fails(
    tmp_path: Path,
) -> None:
    rig = LineRig(tmp_path, 2, ttl_ms=1500)
    health = Topics(rig.port, health_topic(rig.LINE, "a"), health_topic(rig.LINE, "b"))
    try:
        rig.start_active("a", AGENT_HEALTH__INTERVAL_S="1")
        rig.start_agent(
            "b", AGENT_SERIAL__URL=str(tmp_path / "ttyGONE"), AGENT_HEALTH__INTERVAL_S="1"
        )
        document = health.wait(
            health_topic(rig.LINE, "b"),
            lambda d: d.get("role") == "standby" and d.get("ready") is False,
        )
        assert "ttyGONE does not exist" in document["not_ready"]
        assert document["state"] == "failing"
        assert "cannot take over" in document["problem"]
        # Both run the same line alike: one configuration hash (the port is each one's own).
        active = health.wait(health_topic(rig.LINE, "a"), lambda d: d.get("role") == "active")
        assert active["ready"] is True and active["problem"] is None
        assert active["config_hash"] == document["config_hash"] != ""
    finally:
        health.close()
        rig.close()
