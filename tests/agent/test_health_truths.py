"""What an instance says of itself while it changes role: a takeover waiting out the
previous lease says so (it used to say nothing at all, for the whole lock delay), and the
devices of a line being reconciled after a takeover are said to be reconciling, not out of
sync."""

from __future__ import annotations

from pathlib import Path

from tests.ops.support import Topics, health_topic
from tests.support.rig import ACTIVE, DEVICE, LineRig, Rig


def test_a_takeover_waiting_out_the_previous_lease_says_how_long_still(tmp_path: Path) -> None:
    # A store that has served nobody before: the first holder waits a whole lease, as the
    # store may have forgotten one (agent.pair.lock_delay).
    rig = Rig(tmp_path, ttl_ms=3000, served_before=False)
    health = Topics(rig.port, health_topic(DEVICE, "a"))
    try:
        process = rig.start_agent("a", AGENT_HEALTH__INTERVAL_S="1")
        waiting = health.wait(
            health_topic(DEVICE, "a"), lambda d: (d.get("taking_over_s") or 0) > 0, timeout=10
        )
        assert waiting["role"] != "active" and waiting["taking_over_s"] <= 3.0
        process.wait_for_new(ACTIVE, timeout=10)
        active = health.wait(health_topic(DEVICE, "a"), lambda d: d.get("role") == "active")
        assert active["taking_over_s"] is None
    finally:
        health.close()
        rig.close()


def test_devices_being_reconciled_after_a_takeover_are_said_to_be(tmp_path: Path) -> None:
    # 32 units at 9600 baud: reconciling the line takes seconds.
    rig = LineRig(tmp_path, 32, ttl_ms=1500, emulate_baud=9600)
    topics = Topics(rig.port, health_topic(rig.LINE, "a"), "devices/+/status")
    try:
        rig.start_agent("a", AGENT_HEALTH__INTERVAL_S="1")
        topics.wait(health_topic(rig.LINE, "a"), lambda d: d.get("reconciling", 0) > 0, timeout=15)
        during = topics.wait("devices/t32/status", lambda d: d.get("reconciling") is True)
        assert during["in_sync"] is False
        topics.wait("devices/t32/status", lambda d: d["reconciling"] is False and d["in_sync"])
        topics.wait(health_topic(rig.LINE, "a"), lambda d: d.get("reconciling") == 0)
    finally:
        topics.close()
        rig.close()
