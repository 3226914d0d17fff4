"""The agent as a real process: set point sync both ways, through the store."""

from __future__ import annotations

import json
import re
import signal
import time

from tests.support.rig import APPLIED, PUBLISHED, Rig


def test_remote_set_reaches_the_controller(rig: Rig) -> None:
    agent, _ = rig.start_active()
    assert rig.store_value() == b"20.0"  # the controller's value, published at start
    assert rig.remote_set(b"23.5") == b"+OK\r\n"
    rig.wait_device(lambda d: d.setpoint == 23.5)
    agent.wait_for_new(APPLIED)
    assert rig.device_writes() == [23.5]


def test_panel_change_reaches_the_store(rig: Rig) -> None:
    agent, _ = rig.start_active()
    rig.client.request("KEYNOTIFY", "thermostat-1\\setPoint")
    rig.panel(18.5)
    note = rig.client.notifications.get(timeout=10)
    assert note.payload.endswith(b"$4\r\n18.5\r\n")
    assert rig.store_value() == b"18.5"
    agent.wait_for_new(PUBLISHED)
    assert rig.device_writes() == []  # never written back to where it came from


def test_unrounded_remote_value_is_applied_rounded_and_corrected(rig: Rig) -> None:
    rig.start_active()
    rig.remote_set(b"21.3")
    rig.wait_device(lambda d: d.setpoint == 21.5)
    rig.wait_store_value(b"21.5")
    assert rig.device_writes() == [21.5]


NOT_SET_POINTS = (
    b"99.0",  # outside the limits
    b"4.0",
    b"abc",
    b"nan",
    b"inf",
    b"-inf",
    b"",
    b"1e1",
    b" 21.5",
    b"9" * 5000,  # more digits than Python turns into an int by default
    b"\xff\xfe\x00",  # not UTF-8
    # A quarter of a megabyte: with its notification and a read of it, what the test's own
    # client may have waiting stays under the store's 1 MiB a client (a whole megabyte twice
    # over ended that client's connection when a loaded machine read it slowly).
    b"2" * (256 * 1024),
)


def test_values_that_are_not_set_points_never_reach_the_controller(rig: Rig) -> None:
    agent, _ = rig.start_active()
    rig.client.subscribe("devices/thermostat-1/telemetry")
    for bad in NOT_SET_POINTS:
        rig.remote_set(bad)
        agent.wait_for_new(re.compile(r"setPoint .* refused \(.*\); the store gets the unit's"))
        # Not left in the store as if it held: the unit's value is restored there.
        rig.wait_store_value(b"20.0")
    rig.remote_set(b"22.0")  # a valid one after them still goes through
    rig.wait_device(lambda d: d.setpoint == 22.0)
    assert rig.device_writes() == [22.0]
    assert agent.proc.poll() is None
    # Counted: telemetry says how many.
    deadline = time.monotonic() + 10
    while True:
        body = json.loads(
            rig.client.other.get(timeout=max(0.1, deadline - time.monotonic())).payload
        )
        if body["errors"]["invalid_remote_values"] == len(NOT_SET_POINTS):
            break
        assert time.monotonic() < deadline, body


def test_remote_change_while_the_broker_is_down_is_applied_after_it_returns(rig: Rig) -> None:
    agent, _ = rig.start_active(**{"AGENT_LOCK__TTL_MS": "10000"})
    rig.broker_down()
    agent.wait_for_new(re.compile("lost its connection"))
    rig.write_directly(b"26.0")
    rig.broker_up()
    rig.wait_device(lambda d: d.setpoint == 26.0, timeout=15)
    assert rig.device_writes() == [26.0]


def test_local_change_while_the_agent_is_down_wins_over_the_older_store_value(rig: Rig) -> None:
    agent, _ = rig.start_active()
    agent.stop()
    rig.panel(24.0)  # while nobody runs
    agent, _ = rig.start_active()
    rig.wait_store_value(b"24.0")
    assert rig.device_writes() == []


def test_remote_change_while_the_agent_is_down_is_applied_at_start(rig: Rig) -> None:
    agent, _ = rig.start_active()
    agent.stop()
    rig.write_directly(b"27.5")
    rig.start_active()
    rig.wait_device(lambda d: d.setpoint == 27.5)


def test_controller_unplug_and_replug(rig: Rig) -> None:
    agent, _ = rig.start_active()
    rig.fault("UNPLUG", 2.0)
    agent.wait_for_new(re.compile("line lost"))
    rig.remote_set(b"25.5")  # cannot be applied now
    agent.wait_for_new(re.compile("line reopened"), timeout=15)
    rig.wait_device(lambda d: d.setpoint == 25.5, timeout=10)
    assert rig.device_writes() == [25.5]


def test_crossing_changes_end_with_the_one_that_reached_the_store_last(rig: Rig) -> None:
    # A long poll interval: the panel change is still unnoticed when the remote one comes.
    agent, _ = rig.start_active(AGENT_SERIAL__POLL_INTERVAL_S="600")
    rig.panel(24.0)
    rig.remote_set(b"22.0")
    agent.wait_for_new(re.compile(r"published set point 24\.0 .*crossed"))
    assert rig.store_value() == b"24.0"
    assert rig.background.call(lambda: rig.device.setpoint) == 24.0
    assert rig.device_writes() == []


def test_takeover_publishes_a_panel_change_the_former_active_missed(rig: Rig) -> None:
    active, _ = rig.start_active("a", AGENT_SERIAL__POLL_INTERVAL_S="600")
    standby = rig.start_agent("b")
    standby.wait_for_new(re.compile("started as standby"))
    rig.remote_set(b"21.0")
    rig.wait_device(lambda d: d.setpoint == 21.0)
    rig.panel(23.0)  # the active polls rarely and dies before noticing
    active.signal(signal.SIGKILL)
    standby.wait_for_new(re.compile(r"published set point 23\.0"), timeout=10)
    assert rig.store_value() == b"23.0"
