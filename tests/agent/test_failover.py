"""The active/standby pair as real processes: failover, handover, a paused former owner."""

from __future__ import annotations

import re
import signal
import time

from agent.protocol import errors
from tests.support.rig import ACTIVE, APPLIED, STANDBY, STEPPED_DOWN, Rig


def test_standby_never_opens_the_serial_port(rig: Rig) -> None:
    rig.start_active("a")
    standby = rig.start_agent("b")
    standby.wait_for_new(STANDBY)
    rig.remote_set(b"22.5")
    rig.wait_device(lambda d: d.setpoint == 22.5)
    standby.drain()
    assert not any("controller" in line for line in standby.lines), standby.lines


def test_sigkill_of_the_active_fails_over_to_the_standby(rig: Rig) -> None:
    active, _ = rig.start_active("a")
    standby = rig.start_agent("b")
    standby.wait_for_new(STANDBY)
    active.signal(signal.SIGKILL)
    started = time.monotonic()
    standby.wait_for_new(ACTIVE, timeout=10)
    # Taken over only once the lease expired in the store.
    assert time.monotonic() - started >= rig.ttl_ms / 1000 * 0.5
    assert rig.lock_holder() == b"b"
    rig.remote_set(b"24.5")
    rig.wait_device(lambda d: d.setpoint == 24.5)
    standby.wait_for_new(APPLIED)


def test_sigterm_hands_over_without_waiting_for_the_ttl(rig: Rig) -> None:
    ttl_ms = 20_000
    active, _ = rig.start_active("a", AGENT_LOCK__TTL_MS=str(ttl_ms))
    standby = rig.start_agent("b", AGENT_LOCK__TTL_MS=str(ttl_ms))
    standby.wait_for_new(STANDBY)
    started = time.monotonic()
    active.signal(signal.SIGTERM)
    standby.wait_for_new(ACTIVE, timeout=ttl_ms / 1000)
    assert time.monotonic() - started < ttl_ms / 1000 / 4
    assert active.proc.wait(10) == 0
    active.wait_for_new(re.compile("released the lock"))
    rig.remote_set(b"21.0")
    rig.wait_device(lambda d: d.setpoint == 21.0)


def test_paused_former_owner_is_fenced_and_steps_down(rig: Rig) -> None:
    old, old_token = rig.start_active("a")
    new = rig.start_agent("b")
    new.wait_for_new(STANDBY)
    old.signal(signal.SIGSTOP)
    new.wait_for_new(ACTIVE, timeout=10)
    # The new owner writes with its newer token (a local change it publishes).
    rig.panel(19.0)
    new.wait_for_new(re.compile(r"published set point 19\.0"))
    writes_before = len(rig.device_writes())

    # The old owner's token is stale in the store now: its writes are refused.
    response = rig.client.request("SET", "thermostat-1\\setPoint", "30.0", ft=old_token)
    assert response.payload == b"-ERR " + errors.FENCING_TOKEN_LOWER_VERSION.encode() + b"\r\n"

    old.signal(signal.SIGCONT)
    # It says it was stopped, and about how long: through the standby's takeover, which
    # took the rest of a lease (a third of it at least).
    stall = old.wait_for(re.compile(r"did not run for ([0-9.]+) s while it drove the line"))
    assert float(stall.group(1)) >= rig.ttl_ms / 1000 / 3
    reason = old.wait_for_new(STEPPED_DOWN, timeout=10).group(1)
    assert "deadline" in reason or "rejected" in reason or "refused" in reason
    # Changes after the resume reach the controller through the new owner only.
    rig.remote_set(b"23.0")
    rig.wait_device(lambda d: d.setpoint == 23.0)
    new.wait_for_new(APPLIED)
    assert rig.device_writes()[writes_before:] == [23.0]
    old.drain()
    down = next(i for i, line in enumerate(old.lines) if "stepped down" in line)
    resumed = old.lines[down:]
    assert not any("applied remote set point" in line for line in resumed)
    assert not any("published set point" in line for line in resumed)
    assert rig.lock_holder() == b"b"
    assert rig.store_value() == b"23.0"
