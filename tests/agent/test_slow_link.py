"""The pair over a slow link to the store, as real processes through a fault proxy: a start
counted in round trips, a start cut by outages, a lease taken again by its own holder, a
stepped-down instance that writes nothing after its lease."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.protocol.hlc import Hlc
from tests.agent.test_pair_defects import log_time
from tests.ops.support import Topics, health_topic, status
from tests.support.held_requests import hold_requests
from tests.support.rig import ACTIVE, RECONCILED, STANDBY, STEPPED_DOWN, LineRig, line_rig

pytestmark = pytest.mark.slow

UNITS = 8
ONE_WAY_S = 0.2
ROUND_TRIP_S = 2 * ONE_WAY_S


@pytest.fixture
def line(tmp_path: Path) -> Iterator[LineRig]:
    with line_rig(tmp_path, UNITS) as rig:
        yield rig


def test_a_start_over_a_slow_link_takes_a_few_round_trips_whatever_the_line(
    line: LineRig,
) -> None:
    """A standby's start is its connection, its subscriptions, the lock and the control
    keys watched, and a contention: about six round trips, not two per key of the line
    (8 units, 19 keys: 43 round trips, 17 s at 0.2 s each way, when each key was watched
    in turn)."""
    line.start_active("a")
    standby = line.start_agent("b", via_proxy=True, link_delay_s=ONE_WAY_S)
    proxy = line.proxies["b"]
    standby.wait_for(STANDBY, timeout=30)
    ready = time.monotonic()
    connected = line.background.call(lambda: proxy.stats.connected_at[0])
    round_trips = (ready - connected) / ROUND_TRIP_S
    print(f"started as standby {round_trips:.1f} round trips after connecting")
    assert round_trips <= 8, f"started as standby {round_trips:.1f} round trips after connecting"


WATCHED = re.compile(r"watching \d+ device\(s\) in the store")
TOO_SLOW = re.compile(r"too long to hold a lease")
RETRY = re.compile(r"state store not answering yet.*trying again in ([0-9.]+) s")


def test_a_start_cut_by_a_store_outage_tries_again_within_a_ttl(line: LineRig) -> None:
    """A start that the store's outage cut tries again within a TTL, as a reconnect does,
    not after a backoff doubled towards AGENT_MQTT__RECONNECT_MAX_S (30 s): its peer may
    be the only instance left."""
    ttl = {"AGENT_LOCK__TTL_MS": "1000"}
    backoff = {"AGENT_MQTT__RECONNECT_MIN_S": "1", "AGENT_MQTT__RECONNECT_MAX_S": "30"}
    line.start_active("a", **ttl)
    lock_read = line.next_read("b", line.lock_key)
    starting = line.start_agent(
        "b", via_proxy=True, link_delay_s=ONE_WAY_S, AGENT_LOG_LEVEL="DEBUG", **ttl, **backoff
    )
    assert lock_read.wait(30), "b never read the lock"
    line.broker_down()  # the answers on their way, and the rest of the start, lost with it
    time.sleep(3.0)  # the outage is the fault itself
    line.broker_up()
    back = time.time()
    watched = starting.wait_for(WATCHED, timeout=30)
    starting.drain()
    delays = [float(m.group(1)) for s in starting.lines if (m := RETRY.search(s))]
    assert len(delays) >= 3, starting.tail()
    assert max(delays) <= 1.0, delays
    # Back on the broker within a TTL, the next try within one more, then the start itself.
    assert log_time(watched.string) - back <= 1.0 + 1.0 + 6 * ROUND_TRIP_S, starting.tail()


def test_an_instance_that_takes_its_own_lock_again_does_not_wait_out_its_own_lease(
    line: LineRig,
) -> None:
    """A link 0.6 s each way (TTL 1 s): the active's deadline passes though its renewals
    still reach the store and keep its lease there. It steps down, reconnects, finds the lock still
    holding its own value and a sync record (the store kept its contents), and drives again
    at once: the lease it would wait out is its own, and it has not driven since."""
    active, _ = line.start_active("a", via_proxy=True, AGENT_LOCK__TTL_MS="1000")
    proxy = line.proxies["a"]
    line.background.call(lambda: proxy.delay(0.6))
    lost = active.wait_for_new(STEPPED_DOWN, timeout=10)
    line.background.call(proxy.set_pass)
    assert "deadline passed" in lost.string, lost.string
    again = active.wait_for_new(ACTIVE, timeout=10)
    # Its own lease waited out would be a TTL (1 s) past the reconnect.
    assert log_time(again.string) - log_time(lost.string) < 0.9, active.tail()


def test_a_stepped_down_instance_writes_no_history_after_its_lease(line: LineRig) -> None:
    """The store restarts without its contents: the active, back through its proxy, finds
    its lease gone and steps down. Its step-down is not recorded with the lease just lost
    (the emptied store would take it, after the other's grant maybe): no write after the
    lease, even to the line's history. It is recorded ahead of its next takeover, if any."""
    active, _ = line.start_active("a", via_proxy=True, link_delay_s=0.05)
    standby = line.start_agent("b")
    standby.wait_for_new(STANDBY)
    wiped_at, wiped_ms = time.monotonic(), time.time_ns() // 1_000_000
    line.store_restart_forgetting()
    lost = active.wait_for_new(STEPPED_DOWN, timeout=10)
    assert "no longer has the lease" in lost.string, lost.string
    line.wait_key(line.lock_key, lambda value: value is not None, timeout=10)
    history = f"{line.LINE}\\history".encode()
    # Whoever drives next records its takeover there: a write of a's would come before.
    line.wait_key(history.decode(), lambda value: value is not None, timeout=10)
    stale = [
        event
        for event in list(line.store_events)
        if event.key == history
        and event.at > wiped_at
        and event.accepted
        and "-a-" in event.client
        and (event.token is None or Hlc.parse(event.token).wall_ms < wiped_ms)
    ]
    assert stale == [], stale


def test_a_takeover_over_a_slow_link_fences_every_key_at_once(line: LineRig) -> None:
    """Whole thermostats (every point in its key, readings among them): the new active
    fences the sync record, the line's name, the readings and the points of every device
    together, about two round trips after its look at the device's line, not key after
    key (seven round trips then)."""
    profiled = json.dumps(
        [{"id": line.device_id(n), "address": n, "profile": "sim"} for n in range(1, UNITS + 1)]
    )
    active, _ = line.start_active("a", AGENT_DEVICES=profiled)
    standby = line.start_agent("b", via_proxy=True, link_delay_s=ONE_WAY_S, AGENT_DEVICES=profiled)
    standby.wait_for(WATCHED, timeout=30)
    active.signal(signal.SIGKILL)
    standby.wait_for_new(RECONCILED, timeout=30)
    events = list(line.store_events)
    lock = line.lock_key.encode()
    granted = next(e.at for e in events if e.key == lock and e.accepted and "-b-" in e.client)
    first_fence: dict[bytes, float] = {}
    for event in events:
        if event.at > granted and event.accepted and event.token and "-b-" in event.client:
            first_fence.setdefault(event.key, event.at)
    devices = [k for k in first_fence if k.startswith(b"t0")]
    assert len(devices) >= UNITS * 3, sorted(first_fence)
    fenced_in = max(first_fence[k] for k in devices) - granted
    assert fenced_in <= 4.5 * ROUND_TRIP_S, f"every key fenced {fenced_in:.2f} s after the grant"


def test_an_instance_too_slow_for_its_lease_is_said_in_status_health_and_telemetry(
    line: LineRig,
) -> None:
    """A 1.2 s round trip cannot hold a 1 s lease: the standby does not contend, and the
    operator sees the pair has one usable gateway in `agent status`, its health and its
    line's telemetry."""
    line.start_active("a", AGENT_LOCK__TTL_MS="1000")
    telemetry = f"lines/{line.LINE}/telemetry"
    topics = Topics(line.port, health_topic(line.LINE, "b"), telemetry)
    try:
        standby = line.start_agent(
            "b",
            via_proxy=True,
            AGENT_LOCK__TTL_MS="1000",
            AGENT_MQTT__REQUEST_TIMEOUT_S="5",
            AGENT_HEALTH__INTERVAL_S="1",
            AGENT_TELEMETRY__INTERVAL_S="1",
        )
        standby.wait_for_new(STANDBY)
        line.background.call(lambda: line.proxies["b"].delay(0.6))
        standby.wait_for_new(TOO_SLOW, timeout=15)
        health = topics.wait(
            health_topic(line.LINE, "b"),
            lambda d: "too long to hold a lease" in (d.get("problem") or ""),
        )
        assert health["state"] == "failing" and health["round_trip_ms"] > 1000, health
        said = topics.wait(
            telemetry, lambda d: d["instance"] == "b" and d.get("too_slow_for_lease") is True
        )
        assert said["round_trip_ms"] > 1000, said
        _, document = status(line, line.LINE)
        (report,) = document["lines"]
        assert any(
            p.startswith("b is failing") and "too long to hold a lease" in p
            for p in report["problems"]
        ), report["problems"]
    finally:
        topics.close()


def test_a_start_cut_off_with_its_watches_unanswered_watches_once_back(line: LineRig) -> None:
    """b's start: its requests acknowledged by the broker and never answered (the service
    stalled), then its link cut. The answers are gone with the connection (its session is
    a clean one): the devices are watched again once the link is back, not after the
    requests' 10 s timeout (a standby takes over only once its devices are watched)."""
    line.start_active("a", AGENT_LOCK__TTL_MS="6000")
    lock_read = line.next_read("b", line.lock_key)
    starting = line.start_agent(
        "b",
        via_proxy=True,
        link_delay_s=ONE_WAY_S,
        AGENT_LOCK__TTL_MS="6000",
        AGENT_MQTT__REQUEST_TIMEOUT_S="10",
        AGENT_MQTT__RECONNECT_MIN_S="0.05",
        AGENT_MQTT__RECONNECT_MAX_S="0.5",
    )
    proxy = line.proxies["b"]
    assert lock_read.wait(30), "b never read the lock"
    watches: list[bytes] = []
    watching = threading.Event()  # a KEYNOTIFY held for as many keys as there are devices

    def dropped(payload: bytes) -> None:
        if b"KEYNOTIFY" in payload:
            watches.append(payload)
        if len(watches) >= UNITS:
            watching.set()

    release = line.background.call(lambda: hold_requests(line.store, dropped))
    assert watching.wait(10), f"b sent {len(watches)} KEYNOTIFYs after reading the lock"
    # Their acknowledgements on their way back, and read by b before the cut (a reset drops
    # what b has not read): nothing outside b sees that, so the stall lasts round trips.
    time.sleep(3 * ROUND_TRIP_S)
    line.background.call(release)
    starting.drain()
    assert not any(WATCHED.search(s) for s in starting.lines), starting.tail()
    cut_at = time.time()
    line.background.call(proxy.cut)
    watched = starting.wait_for(WATCHED, timeout=30)
    # The reconnect, its subscriptions, then each key's KEYNOTIFY and GET: a few round trips.
    took = log_time(watched.string) - cut_at
    assert took <= 8 * ROUND_TRIP_S, (took, starting.tail())
