"""The lease governs every byte on the line, and no change is lost between a read and a
write: one test per defect found in the last metre, each with real processes (agents, the
embedded store, the fake line) driven through the fault, and each judged from outside:
the line's and the store's own records, never the agents' word.

Each fails on a build without its fix (run them with TEST_AGENT_SOURCE=<an older checkout>
to see it).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import AgentProcess
from tests.support.rig import ACTIVE, RECONCILED, STANDBY, STEPPED_DOWN, LineRig, Rig

pytestmark = pytest.mark.slow

LOST_LEASE = re.compile(r"lock .* lost")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    setup = Rig(tmp_path, ttl_ms=1000)
    try:
        yield setup
    finally:
        setup.close()


# ------------------------------------------------------------------ 1. bytes after the lease


@pytest.mark.timeout(120)
def test_no_byte_goes_on_the_line_after_the_lease_ended(rig: Rig) -> None:
    """A point-to-point controller whose replies come late: after each lost reply the driver
    waits for a quiet line (a reply timeout, more while the late reply comes in) before the
    next request. The lease ends again and again (the link a black hole) while the driver
    waits; a request that goes out after the wait must still be inside the lease."""
    agent = rig.start_agent(
        "a",
        via_proxy=True,
        AGENT_SERIAL__PROBE_INTERVAL_S="0.05",
        AGENT_SERIAL__POLL_INTERVAL_S="0.05",
        AGENT_MQTT__KEEPALIVE_S="2",
    )
    agent.wait_for_new(ACTIVE, timeout=10)
    rig.fault("SLOW", 800)  # every reply later than the 567 ms reply timeout
    proxy = rig.proxies["a"]
    for _ in range(8):
        rig.background.call(proxy.blackhole)
        agent.wait_for_new(LOST_LEASE, timeout=10)
        time.sleep(0.6)  # the link stays dark until the store's lease has expired too
        rig.background.call(proxy.set_pass)
        agent.wait_for_new(ACTIVE, timeout=10)
    records = rig.background.call(lambda: rig.device.records)
    assert sum(r.client.startswith("a-") for r in records) >= 8  # the line was driven
    assert rig.wire_violations() == []


# ------------------------------------------------------------------ 2. a panel change in a wait


def test_a_panel_change_made_while_a_write_waits_is_published_and_wins(rig: Rig) -> None:
    """Two remote changes less than one least write interval apart (a slider), and a knob
    turned while the second write waits its turn: the knob reached the store last."""
    rig.start_active(
        "a", AGENT_SERIAL__MIN_WRITE_INTERVAL_S="1.5", AGENT_SERIAL__POLL_INTERVAL_S="0.1"
    )
    assert rig.remote_set(b"22.0") == b"+OK\r\n"
    rig.wait_device(lambda d: d.setpoint == 22.0)
    assert rig.remote_set(b"23.0") == b"+OK\r\n"  # waits 1.5 s for the unit's interval
    time.sleep(0.3)  # the person turns the knob while it waits (the fault is the timing)
    rig.panel(18.5)
    rig.wait_store_value(b"18.5", timeout=10)
    time.sleep(2.0)  # past the moment the waiting write would have gone out
    assert rig.background.call(lambda: rig.device.setpoint) == 18.5
    assert rig.store_value() == b"18.5"
    assert rig.device_writes() == [22.0]


# ------------------------------------------------------------------ 3. reverted at a takeover


def test_a_remote_change_is_not_reverted_when_the_active_was_cut_off_from_the_store(
    tmp_path: Path,
) -> None:
    """The active hears a remote change but nothing it sends reaches the store any more;
    the standby is away meanwhile and a newer remote change is accepted. The standby takes
    over: the newer change ends on the unit and in the store, never the older one."""
    rig = Rig(tmp_path, ttl_ms=1500)
    try:
        active, _ = rig.start_active("a", via_proxy=True, AGENT_MQTT__KEEPALIVE_S="10")
        standby = rig.start_agent("b", via_proxy=True)
        standby.wait_for_new(STANDBY)
        rig.wait_store_value(b"20.0")
        rig.background.call(lambda: rig.proxies["a"].blackhole("in"))  # a hears, cannot say
        rig.background.call(lambda: rig.proxies["b"].blackhole())  # b is away
        assert rig.remote_set(b"22.0") == b"+OK\r\n"  # reaches a, which may apply it
        time.sleep(0.5)  # a decides meanwhile (the fault is the timing)
        assert rig.remote_set(b"24.5") == b"+OK\r\n"  # a newer one, which nobody hears
        active.wait_for_new(STEPPED_DOWN, timeout=10)  # a's lease ran out
        rig.background.call(lambda: rig.proxies["b"].set_pass())
        standby.wait_for_new(ACTIVE, timeout=15)
        rig.wait_device(lambda d: d.setpoint == 24.5, timeout=10)
        rig.wait_store_value(b"24.5", timeout=10)
        standby.wait_for(RECONCILED)
        standby.drain()
        assert not any("published set point 22.0" in line for line in standby.lines)
        assert rig.store_value() == b"24.5"
    finally:
        rig.close()


# ------------------------------------------------------------------ 4. a write in doubt


def test_the_agents_own_write_in_doubt_is_no_panel_change(rig: Rig) -> None:
    """A write reaches the unit but its reply never comes (the unit answers writes later
    than the reply timeout); the unit then falls silent and is quarantined while newer
    remote changes are accepted; when it answers again, the newest remote change is
    applied, not the timed-out write published as a panel change over it."""
    agent, _ = rig.start_active(
        "a", AGENT_SERIAL__PROBE_INTERVAL_S="1", AGENT_SERIAL__POLL_INTERVAL_S="0.1"
    )
    rig.fault("SLOWWRITE", 800)
    assert rig.remote_set(b"22.0") == b"+OK\r\n"
    rig.wait_device(lambda d: d.setpoint == 22.0)  # it got there; its answer comes late
    agent.wait_for_new(re.compile(r"could not apply set point 22.0"), timeout=10)
    rig.fault("SILENT", 60)
    agent.wait_for_new(re.compile(r"not answering; quarantined"), timeout=10)
    assert rig.remote_set(b"23.0") == b"+OK\r\n"
    assert rig.remote_set(b"24.0") == b"+OK\r\n"
    rig.fault("CLEAR")
    rig.wait_device(lambda d: d.setpoint == 24.0, timeout=15)
    rig.wait_store_value(b"24.0")
    agent.drain()
    assert not any("published set point 22.0" in line for line in agent.lines), agent.lines
    assert rig.store_value() == b"24.0"


# ------------------------------------------------------------------ a line of 8, under load


def _agent_lines(process: AgentProcess) -> list[str]:
    process.drain()
    return process.lines


def test_a_line_under_load_keeps_every_byte_inside_the_lease_across_a_failover(
    tmp_path: Path,
) -> None:
    """One remote change per unit per second on a line of 8 while the active is cut off
    and the standby takes over: every transaction within a lease, and the line ends with
    each unit holding its newest change."""
    line = LineRig(tmp_path, 8, ttl_ms=1000)
    try:
        line.start_active("a", via_proxy=True, AGENT_MQTT__KEEPALIVE_S="2")
        second = line.start_agent("b")
        second.wait_for_new(STANDBY)
        newest: dict[int, bytes] = {}
        for second_of_load in range(6):
            if second_of_load == 2:
                line.background.call(line.proxies["a"].blackhole)
            for address in range(1, 9):
                # Values on the units' 0.5 grid: what is written is what is read back.
                change = f"{15 + (second_of_load * 8 + address) % 40 / 2:.1f}".encode()
                if line.remote_set_device(address, change) == b"+OK\r\n":
                    newest[address] = change
            time.sleep(1.0 / 1)  # one change per unit per second (the load is the point)
        line.background.call(line.proxies["a"].set_pass)
        line.wait_store(newest, timeout=15)
        line.wait_line(
            lambda fake: all(fake.unit(n).setpoint == float(v) for n, v in newest.items()),
            timeout=15,
        )
        assert line.wire_violations() == []
        assert any(ACTIVE.search(text) for text in _agent_lines(second))
    finally:
        line.close()
