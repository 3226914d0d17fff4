"""The pair under the faults that once lost changes or stalled it, one test per defect.

Each drives the real processes (two agents, the embedded store, the fake device) through
the fault as it was found, and checks what must hold: no change lost, one instance driving,
an active again after the fault.
"""

from __future__ import annotations

import re
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from agent.protocol.resp3 import encode_request
from tests.agent.test_clock_step import faked_env, libfaketime  # noqa: F401 (a fixture)
from tests.support.processes import AgentProcess
from tests.support.rig import ACTIVE, LOCK_KEY, RECORD_KEY, STANDBY, STEPPED_DOWN, Rig

pytestmark = pytest.mark.slow

DUPLICATE = re.compile(r"another process .*instance id")
WAITING = re.compile(r"waiting ([0-9.]+) s for the previous lease to end")
PUBLISHED_AT_TAKEOVER = re.compile(r"published set point (\S+)")
TOOK_OVER = re.compile(r"line open: ")


def log_time(line: str) -> float:
    """The wall-clock time of an agent's log line (same machine, so comparable)."""
    stamp = " ".join(line.split()[:2])
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def start_pair(rig: Rig, **extra: str) -> tuple[AgentProcess, AgentProcess]:
    active, _ = rig.start_active("a", **extra)
    standby = rig.start_agent("b", **extra)
    standby.wait_for_new(STANDBY)
    rig.wait_store_value(b"20.0")
    return active, standby


# ------------------------------------------------------------------ 1. changes in a failover


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["sigkill", "sigstop"])
def test_remote_change_made_during_a_failover_is_not_lost(rig: Rig, fault: int) -> None:
    active, standby = start_pair(rig)
    active.signal(fault)
    # Fenced with the lock's current version: the former active's lease, not yet expired.
    assert rig.remote_set(b"24.5") == b"+OK\r\n"
    standby.wait_for_new(ACTIVE, timeout=10)
    rig.wait_device(lambda d: d.setpoint == 24.5)
    rig.wait_store_value(b"24.5")
    standby.drain()
    assert not any("published set point 20.0" in line for line in standby.lines)
    if fault == signal.SIGSTOP:
        active.signal(signal.SIGCONT)
        active.wait_for_new(STEPPED_DOWN, timeout=10)
    assert rig.device_writes() == [24.5]
    assert rig.store_value() == b"24.5"


def test_panel_change_made_during_a_failover_is_not_lost(rig: Rig) -> None:
    active, standby = start_pair(rig)
    active.signal(signal.SIGKILL)
    rig.panel(18.5)
    standby.wait_for_new(ACTIVE, timeout=10)
    rig.wait_store_value(b"18.5")
    assert rig.device_writes() == []


def test_remote_and_panel_change_in_one_failover_end_by_the_crossing_rule(rig: Rig) -> None:
    active, standby = start_pair(rig)
    active.signal(signal.SIGKILL)
    assert rig.remote_set(b"24.5") == b"+OK\r\n"
    rig.panel(18.5)  # never reached the store: it reaches it last, so it wins
    standby.wait_for_new(ACTIVE, timeout=10)
    rig.wait_store_value(b"18.5")
    assert rig.background.call(lambda: rig.device.setpoint) == 18.5
    assert rig.device_writes() == []


# ------------------------------------------------------------------ 2. one instance id twice


def test_two_instances_with_the_same_instance_id_never_both_drive(rig: Rig) -> None:
    first, _ = rig.start_active("gw")
    clone = rig.start_agent("gw")  # a gateway cloned from the same image
    clone.wait_for_new(DUPLICATE, timeout=10)
    assert rig.remote_set(b"23.0") == b"+OK\r\n"
    rig.wait_device(lambda d: d.setpoint == 23.0)
    rig.wait_store_value(b"23.0")
    first.drain()
    clone.drain()
    assert not any(ACTIVE.search(line) for line in clone.lines), clone.lines
    assert rig.device_writes() == [23.0]


# ------------------------------------------------------------------ 3. one fast clock


def test_a_client_with_a_fast_clock_does_not_take_healthy_agents_out(
    rig: Rig,
    libfaketime: str,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    offset = tmp_path / "offset"
    offset.write_text("-2\n")  # a healthy gateway, two seconds slow
    active, _ = rig.start_active("a", **faked_env(libfaketime, offset))
    standby = rig.start_agent("b", **faked_env(libfaketime, offset))
    standby.wait_for_new(STANDBY)
    # Another client, 59 s fast (allowed: under a minute), pushes the service's clock.
    fast_ts = f"{time.time_ns() // 1_000_000 + 59_000:015d}:00000:fast"
    fast = rig.client.request("GET", "anything", ts=fast_ts)
    assert fast.payload == b"$-1\r\n"
    # The healthy pair keeps its lease (renewals over two leases) and applies a change.
    ttl_s = rig.ttl_ms / 1000
    rig.watch_lock()
    for _ in range(6):
        rig.expect_renewal("a", ttl_s)
    assert rig.remote_set(b"22.5") == b"+OK\r\n"
    rig.wait_device(lambda d: d.setpoint == 22.5, timeout=3 * ttl_s)
    active.drain()
    standby.drain()
    assert not any(STEPPED_DOWN.search(line) for line in active.lines), active.lines
    assert not any("refus" in line for line in active.lines + standby.lines)
    assert rig.lock_holder() == b"a"


# ------------------------------------------------------------------ 4. a burst of changes


def test_a_burst_of_remote_changes_collapses_to_the_newest(rig: Rig) -> None:
    rig.start_active("a", AGENT_SERIAL__MIN_WRITE_INTERVAL_S="1.0")
    for value in range(20):
        rig.remote_set(f"{10 + value}.0".encode())
    rig.wait_device(lambda d: d.setpoint == 29.0, timeout=10)
    rig.wait_store_value(b"29.0")
    writes = rig.device_writes()
    assert writes[-1] == 29.0 and len(writes) <= 3, writes


# ------------------------------------------------------------------ 7. a store that forgets


def test_a_store_that_forgets_its_lock_never_lets_two_instances_drive(rig: Rig) -> None:
    """The standby gets the lock on the emptied store while the active, paused through the
    restart, is still inside its own lease: the new holder waits for that lease to end."""
    ttl = "3000"
    active, standby = start_pair(rig, AGENT_LOCK__TTL_MS=ttl)
    active.signal(signal.SIGSTOP)  # the active cannot get back to the store first
    rig.store_restart_forgetting(outage_s=0.3)
    standby.wait_for_new(WAITING, timeout=10)  # b holds the lock, but does not drive yet
    active.signal(signal.SIGCONT)  # still within its local deadline
    stepped = log_time(active.wait_for_new(STEPPED_DOWN, timeout=10).string)
    became = log_time(standby.wait_for_new(ACTIVE, timeout=10).string)
    assert became > stepped, "the new active drove while the former one still did"
    assert rig.remote_set(b"25.5") == b"+OK\r\n"
    rig.wait_device(lambda d: d.setpoint == 25.5, timeout=10)
    assert rig.device_writes() == [25.5]


def test_a_store_that_forgets_everything_gets_the_set_point_back(rig: Rig) -> None:
    active, _ = start_pair(rig)
    rig.panel(21.0)
    rig.wait_store_value(b"21.0")
    rig.store_restart_forgetting()
    # The set point key is republished from the controller, by whoever is active.
    rig.wait_store_value(b"21.0", timeout=10)
    assert rig.remote_set(b"22.0") == b"+OK\r\n"
    rig.wait_device(lambda d: d.setpoint == 22.0, timeout=10)
    assert rig.device_writes() == [22.0]
    assert active.proc.poll() is None


def publish_with_its_answer_lost(rig: Rig) -> tuple[AgentProcess, AgentProcess]:
    """A pair; a panel change (18.5) the active publishes with the record marking it, both
    taken by the store, the answers never reaching the active (the standby follows the
    mark). Returns (active, standby)."""
    active, _ = rig.start_active("a", via_proxy=True)
    standby = rig.start_agent("b")
    standby.wait_for_new(STANDBY)
    rig.background.call(lambda: rig.proxies["a"].blackhole("out"))  # no answer reaches a
    rig.panel(18.5)
    rig.wait_key(RECORD_KEY, lambda record: record is not None and b'"published":18.5' in record)
    return active, standby


def the_remote_change_wins_over_the_panel_value(agent: AgentProcess, rig: Rig) -> None:
    """The remote 24.5, made after the panel's 18.5 reached the store, ends on both sides;
    `agent` never published 18.5 over it."""
    rig.wait_device(lambda d: d.setpoint == 24.5)
    rig.wait_store_value(b"24.5")
    agent.drain()
    assert not any("published set point 18.5" in line for line in agent.lines)


def test_a_sync_the_emptied_store_forgot_is_not_taken_for_a_panel_change(rig: Rig) -> None:
    """A 30-minute soak's remote change reverted. The active synced a panel change while the
    standby was away; the store then restarted without its contents, the record with it; an
    active took the lock again but could not reconcile the unit in time (here: a restarted
    process, and a unit that does not answer). The standby knew only its older sync: when it
    took over, the unit's value looked like a panel change made meanwhile and was published
    over a remote change written to the emptied store. An active that takes over a store
    without the device's record now writes what it last synced there at once, before it
    reconciles anything, so that its standby knows it."""
    active, standby = start_pair(rig)
    standby.signal(signal.SIGKILL)  # its state file keeps 20.0
    rig.panel(18.5)
    rig.wait_key(RECORD_KEY, lambda record: record is not None and b'"value":18.5' in record)
    active.signal(signal.SIGKILL)  # its state file keeps 18.5
    rig.fault("SILENT", 60)  # the unit stops answering: nothing is reconciled
    rig.store_restart_forgetting()
    active = rig.start_agent("a")
    active.wait_for_new(ACTIVE, timeout=10)
    standby = rig.start_agent("b")  # reads the record as it starts
    standby.wait_for_new(STANDBY)
    assert rig.remote_set(b"24.5") == b"+OK\r\n"  # the active cannot apply it: no answer
    active.signal(signal.SIGKILL)
    rig.fault("CLEAR")  # the unit answers again, still at the panel change's 18.5
    standby.wait_for_new(ACTIVE, timeout=10)
    the_remote_change_wins_over_the_panel_value(standby, rig)


def test_a_publish_the_emptied_store_forgot_is_still_counted_by_the_next_active(
    rig: Rig,
) -> None:
    """A 10-minute soak's remote change reverted (seed 621). The active published a panel
    change and its record marking it; the store took both, its answers never came back, and
    the store restarted without its contents. The standby, which had followed the mark,
    took over the emptied store but could not reconcile the unit (here: it does not answer);
    the record it wrote there said its own older sync and not the mark, and it was killed.
    The next active (a process just restarted, which remembers nothing of its publish) took
    the unit's value for a panel change and published it over a remote change written to
    the emptied store. A takeover's records now carry the publish it counts as the store's
    until it has reconciled the unit."""
    active, standby = publish_with_its_answer_lost(rig)
    rig.wait_store_value(b"18.5")
    active.signal(signal.SIGKILL)
    rig.fault("SILENT", 60)  # the unit stops answering: nothing is reconciled
    rig.store_restart_forgetting()
    standby.wait_for_new(ACTIVE, timeout=10)
    rig.wait_key(RECORD_KEY, lambda record: record is not None)  # what it knows, at once
    assert rig.remote_set(b"24.5") == b"+OK\r\n"  # the active cannot apply it: no answer
    standby.signal(signal.SIGKILL)
    active = rig.start_agent("a")
    active.wait_for_new(ACTIVE, timeout=10)
    rig.fault("CLEAR")  # the unit answers again, still at the panel change's 18.5
    the_remote_change_wins_over_the_panel_value(active, rig)


def test_a_store_that_forgets_everything_leaves_the_line_to_the_active_that_knows_it(
    rig: Rig,
) -> None:
    """A 5-minute soak's remote changes reverted (seed 4324, four units). A standby that had
    not read the active's last syncs (here: cut off; there: restarted a moment before) got
    the lock first on a store restarted without its contents, and took the unit's values,
    synced by the active, for panel changes: it published them over the remote changes
    written to the emptied store. The holder of the lease the store forgot asks for the
    lock at once; a standby leaves it to that holder until the lease could have ended."""
    ttl = "3000"
    active, _ = rig.start_active("a", AGENT_LOCK__TTL_MS=ttl)
    standby = rig.start_agent("b", via_proxy=True, AGENT_LOCK__TTL_MS=ttl)
    standby.wait_for_new(STANDBY)
    rig.wait_store_value(b"20.0")
    rig.background.call(lambda: rig.proxies["b"].blackhole())  # b hears nothing from here
    rig.panel(18.5)
    rig.wait_key(RECORD_KEY, lambda record: record is not None and b'"value":18.5' in record)
    active.signal(signal.SIGSTOP)  # b reaches the emptied store first
    rig.store_restart_forgetting(setpoint=b"24.5")  # a remote change, the agents away
    rig.background.call(lambda: rig.proxies["b"].cut())
    standby.wait_for_new(re.compile("reconnected to the broker"), timeout=10)
    active.signal(signal.SIGCONT)
    active.wait_for_new(ACTIVE, timeout=15)
    the_remote_change_wins_over_the_panel_value(standby, rig)
    assert sum("published set point 18.5" in line for line in active.lines) == 1  # the panel's


def test_a_takeover_that_cannot_read_the_unit_still_decides_on_the_former_publish(
    rig: Rig,
) -> None:
    """A 30-minute soak's remote change reverted. The active published a panel change (its
    answer lost) and was killed; the standby, which had followed the record marking it, took
    over while the unit did not answer, so its reconcile at the takeover decided nothing, and
    the mark was dropped with it. When the unit answered again, a remote change made
    meanwhile arrived on a sync that no longer knew the unit's value had reached the store,
    and the value was published over it. The takeover now decides first, once it can."""
    active, standby = publish_with_its_answer_lost(rig)
    rig.fault("SILENT", 60)  # the unit stops answering
    active.signal(signal.SIGKILL)
    standby.wait_for_new(ACTIVE, timeout=10)
    assert rig.remote_set(b"24.5") == b"+OK\r\n"
    time.sleep(1.0)  # the fault: a unit silent for a while after the takeover
    rig.fault("CLEAR")  # it answers again, at the panel change's 18.5
    the_remote_change_wins_over_the_panel_value(standby, rig)


def test_an_active_that_kept_its_lease_counts_its_own_publish_lost_in_flight(rig: Rig) -> None:
    """A 30-minute soak's remote change reverted (seed 651). The active published a panel
    change with the record marking it; the store took both, the answers were lost with the
    connection, and a remote change came after. The active kept its lease across the
    reconnect, and its reconcile took the unit's value for a panel change crossing the
    remote one and published it over it. A publish in doubt is now judged on the record read
    back, as a takeover judges the former active's."""
    lease_kept = {"AGENT_LOCK__TTL_MS": "6000", "AGENT_MQTT__RECONNECT_MIN_S": "0.2"}
    active, _ = rig.start_active("a", via_proxy=True, **lease_kept)
    proxy = rig.proxies["a"]
    rig.background.call(lambda: proxy.blackhole("out"))  # no answer reaches a
    rig.panel(18.5)
    rig.wait_key(RECORD_KEY, lambda record: record is not None and b'"published":18.5' in record)
    rig.wait_store_value(b"18.5")
    assert rig.remote_set(b"24.5") == b"+OK\r\n"  # after the panel change reached the store
    rig.background.call(proxy.cut)  # the connection, and the answers with it, lost
    the_remote_change_wins_over_the_panel_value(active, rig)
    assert not any(STEPPED_DOWN.search(line) for line in active.lines), "the lease was lost"


# ------------------------------------------------------------------ 5. a lease on a slow link


def last_role(agent: AgentProcess) -> str | None:
    agent.drain()
    role = None
    for line in agent.lines:
        if ACTIVE.search(line):
            role = "active"
        elif STEPPED_DOWN.search(line) or STANDBY.search(line):
            role = "standby"
    return role


def test_an_instance_is_never_active_without_a_lease_and_someone_always_contends(
    rig: Rig,
) -> None:
    """0.6 s of one-way delay on the active's link: renewals take longer than a third of
    the lease, yet the store grants them. Afterwards exactly the holder is active, and when
    it dies the other takes over."""
    ttl = {"AGENT_LOCK__TTL_MS": "3000"}
    agents = {"a": rig.start_active("a", via_proxy=True, **ttl)[0]}
    agents["b"] = rig.start_agent("b", via_proxy=True, **ttl)
    agents["b"].wait_for_new(STANDBY)
    rig.background.call(lambda: rig.proxies["a"].delay(0.6, "in"))
    time.sleep(4 * 3.0)  # the fault is the slow link itself, over four leases
    rig.background.call(rig.proxies["a"].set_pass)
    rig.watch_lock()
    rig.expect_renewal(rig.lock_holder().decode(), 3.0)  # type: ignore[union-attr]
    holder = rig.lock_holder()
    assert holder is not None
    other = "b" if holder == b"a" else "a"
    assert last_role(agents[holder.decode()]) == "active"
    assert last_role(agents[other]) == "standby", agents[other].lines
    # Someone always contends: the holder dies, the other takes over within the lease.
    killed = time.monotonic()
    agents[holder.decode()].signal(signal.SIGKILL)
    agents[other].wait_for_new(ACTIVE, timeout=3.0 + 3.0)
    assert time.monotonic() - killed <= 3.0 + 1.0
    assert rig.lock_holder() == other.encode()


# ------------------------------------------------------------------ 6. a short link reset


def test_a_one_second_link_reset_keeps_the_role_and_the_change_made_meanwhile(rig: Rig) -> None:
    ordinary_backoff = {
        "AGENT_LOCK__TTL_MS": "3000",
        "AGENT_MQTT__RECONNECT_MIN_S": "0.5",
        "AGENT_MQTT__RECONNECT_MAX_S": "30",
    }
    active, _ = rig.start_active("a", via_proxy=True, **ordinary_backoff)
    standby = rig.start_agent("b", **ordinary_backoff)
    standby.wait_for_new(STANDBY)
    proxy = rig.proxies["a"]
    for trial in range(7):  # as the defect was found: 3 of 7 lost the role
        value = f"{21 + trial}.0".encode()

        def reset() -> None:
            proxy.cut()
            proxy.drop()  # and refused, for the length of the outage

        rig.background.call(reset)
        assert rig.remote_set(value) == b"+OK\r\n"  # made during the outage
        time.sleep(1.0)  # the outage is the fault itself
        rig.background.call(proxy.set_pass)
        rig.wait_device(lambda d, v=float(value): d.setpoint == v, timeout=10)
        rig.wait_store_value(value)
    active.drain()
    standby.drain()
    assert not any(STEPPED_DOWN.search(line) for line in active.lines), active.lines
    assert not any(ACTIVE.search(line) for line in standby.lines)


# ------------------------------------------------------------------ 7. a partition that heals


def test_a_write_the_former_active_sent_into_a_partition_never_lands_when_it_heals(
    rig: Rig,
) -> None:
    """The store fences a key by the token of its last write, not by the lock: a panel
    change the active published into a black-holed link, delivered after the other instance
    took over without writing that key, was once accepted, and the new active applied the
    stale value to the controller as if it were a remote change. Now the former active resets
    its link when its lease ends unanswered (what it held is dropped), and the new active
    writes each key back with its token before it decides anything."""
    slow = {"AGENT_LOCK__TTL_MS": "3000", "AGENT_MQTT__REQUEST_TIMEOUT_S": "30"}
    active, _ = rig.start_active("a", via_proxy=True, **slow)
    standby = rig.start_agent("b", **slow)
    standby.wait_for_new(STANDBY)
    standby.signal(signal.SIGSTOP)  # contends again once the panel is back
    rig.background.call(rig.proxies["a"].blackhole)
    rig.panel(18.5)  # read by the active and published into the partition
    active.wait_for_new(STEPPED_DOWN, timeout=10)
    rig.panel(20.0)  # back before anyone drives the line again
    standby.signal(signal.SIGCONT)
    standby.wait_for_new(TOOK_OVER, timeout=15)
    rig.background.call(rig.proxies["a"].set_pass)  # the partition heals
    active.wait_for_new(re.compile(r"MQTT client \S+ connected to|published set point 18.5"), 15)
    assert rig.remote_set(b"24.5") == b"+OK\r\n"
    rig.wait_device(lambda d: d.setpoint == 24.5)
    active.drain()
    assert not any("published set point 18.5" in line for line in active.lines)
    assert rig.device_writes() == [24.5]


# ------------------------------------------------------------------ 8. a lease gone at reconnect


def test_a_lease_gone_at_reconnect_is_not_waited_out_when_the_store_kept_its_contents(
    rig: Rig,
) -> None:
    """After a reconnect the active renews only a lock the store still has. Gone, it is a
    lost lease; but a sync record still in the store proves the store did not forget its
    contents (the lock expired or was deleted), so the active takes the lock again at once
    instead of waiting a whole TTL of lock delay with nobody driving the line."""
    active, _ = rig.start_active("a", via_proxy=True, AGENT_LOCK__TTL_MS="3000")
    proxy = rig.proxies["a"]

    def cut_and_refuse() -> None:
        proxy.cut()
        proxy.drop()

    rig.background.call(cut_and_refuse)
    rig.background.call(
        lambda: rig.store.store.handle(
            "remote", encode_request([b"DEL", LOCK_KEY.encode()]), None, None
        )
    )
    rig.background.call(proxy.set_pass)
    lost = active.wait_for_new(STEPPED_DOWN, timeout=10)
    assert "no longer has the lease" in lost.string, lost.string
    again = active.wait_for_new(ACTIVE, timeout=10)
    active.drain()
    since_the_loss = active.lines[active.lines.index(lost.string) :]
    assert not any(WAITING.search(line) for line in since_the_loss), since_the_loss
    assert log_time(again.string) - log_time(lost.string) < 1.0


# ------------------------------------------------------------------ 9. a refusal never heard


def test_a_refused_publish_whose_answer_never_came_back_is_published_again_by_its_sender(
    rig: Rig,
) -> None:
    """A 30-minute soak's lost panel change. The active's answers stopped coming back: its
    renewals still reached the store, and a remote writer fenced a change with the newest of
    them; the active published a panel change with the older token it knew (refused) and
    marked it in its record (taken). Its lease ended before the refusal came back. It
    caught up on reconnect (the remote change), a second remote change came after the
    record, and it took the line again believing its mark: it took the unit's value for
    synced and wrote the remote change over the panel change. What it saw of the key since
    its reconnect shows the key held the remote change when the record was written: the
    publish never reached the store, and the panel change is published again."""
    # Renewed every 2 s: blackholed right after a renewal, the lease lasts 3.7 s at least.
    slow = {"AGENT_LOCK__TTL_MS": "6000", "AGENT_MQTT__REQUEST_TIMEOUT_S": "30"}
    active, _ = rig.start_active("a", via_proxy=True, **slow)
    proxy = rig.proxies["a"]
    rig.watch_lock()
    rig.expect_renewal("a", timeout=5)
    rig.background.call(lambda: proxy.blackhole("out"))
    rig.expect_renewal("a", timeout=5)  # taken by the store, never answered
    assert rig.remote_set(b"24.5") == b"+OK\r\n"  # fenced with that renewal's version
    rig.panel(18.5)  # published with the older token: refused; the record behind it taken
    rig.wait_key(RECORD_KEY, lambda record: record is not None and b'"published":18.5' in record)
    assert rig.store_value() == b"24.5"
    active.wait_for_new(STEPPED_DOWN, timeout=10)
    caught_up = rig.next_read("a")
    rig.background.call(proxy.set_pass)
    assert caught_up.wait(10), "no catch-up read after the reconnect"
    assert rig.remote_set(b"22.0") == b"+OK\r\n"  # after the record, before it drives again
    active.wait_for_new(TOOK_OVER, timeout=15)
    rig.wait_store_value(b"18.5")
    rig.wait_device(lambda d: d.setpoint == 18.5)
    assert 22.0 not in rig.device_writes()
    active.drain()
    assert any("publish of set point 18.5 never reached the store" in line for line in active.lines)
