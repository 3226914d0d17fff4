"""What the agents say about themselves, for monitoring: retained health with a Last Will,
each device's status and availability, the HTTP endpoint, and the unit's status line."""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.test_notify import NotifyListener
from tests.ops.support import Topics, health_topic, wait_in_sync, wait_pair
from tests.support.rig import STANDBY, LineRig

LINE = LineRig.LINE
ENDPOINT = re.compile(r"health endpoint at http://([\d.]+):(\d+)/health")


def test_the_will_says_down_when_an_agent_is_killed(line: LineRig, topics: Topics) -> None:
    first, _ = line.start_active("a")
    second = line.start_agent("b")
    second.wait_for_new(STANDBY)
    wait_pair(topics, LINE, "a", "b")
    # Health is published from before the takeover (a standby at first): the active's word.
    up = topics.wait(
        health_topic(LINE, "a"), lambda d: d["status"] == "up" and d["role"] == "active"
    )
    assert up["pid"] == first.proc.pid and up["line"] == LINE and up["ttl_ms"] == line.ttl_ms
    assert up["role"] == "active" and up["token"] and up["version"]
    assert up["devices"] == line.device_ids and up["state"] == "running", up

    mark = topics.count(health_topic(LINE, "a"))
    first.signal(signal.SIGKILL)
    down = topics.wait(health_topic(LINE, "a"), lambda d: d["status"] == "down", after=mark)
    assert down == {
        "status": "down",
        "pid": first.proc.pid,
        "line": LINE,
        "instance": "a",
        "reason": "connection lost",
    }
    # Retained: whoever looks later sees it too.
    later = Topics(line.port, health_topic(LINE, "+"))
    try:
        assert later.wait(health_topic(LINE, "a"))["status"] == "down"
    finally:
        later.close()

    # The standby took over; stopped cleanly it says "down" itself, and its devices offline.
    topics.wait(health_topic(LINE, "b"), lambda d: d["role"] == "active", after=0)
    wait_in_sync(topics, line.device_ids, by="b")
    mark = topics.count(health_topic(LINE, "b"))
    marks = {d: topics.count(f"devices/{d}/availability") for d in line.device_ids}
    second.stop()
    stopped = topics.wait(health_topic(LINE, "b"), lambda d: d["status"] == "down", after=mark)
    assert stopped["reason"] == "stopped" and stopped["pid"] == second.proc.pid
    for device, after in marks.items():
        topic = f"devices/{device}/availability"
        assert topics.wait(topic, after=after, parse=False) == b"offline"


def test_each_device_reports_its_status_and_availability(line: LineRig, topics: Topics) -> None:
    line.start_active("a", AGENT_SERIAL__PROBE_INTERVAL_S="0.3")
    wait_in_sync(topics, line.device_ids)
    status = topics.wait("devices/t03/status", lambda d: d["in_sync"])
    assert status["line"] == LINE and status["instance"] == "a"
    assert (status["store"], status["setpoint"], status["controller"]) == ("20.0", 20.0, "ok")
    assert status["availability"] == "online" and status["last_sync"]
    assert set(status["errors"]) >= {"controller_errors", "store_errors", "lock_losses"}

    # A remote change shows on the device's status once applied.
    mark = topics.count("devices/t03/status")
    assert line.remote_set_device(3, b"24.5") == b"+OK\r\n"
    applied = topics.wait(
        "devices/t03/status", lambda d: d["setpoint"] == 24.5 and d["in_sync"], after=mark
    )
    assert applied["store"] == "24.5"

    # A unit that goes silent is offline at once, and online again when it answers.
    marks = (topics.count("devices/t02/availability"), topics.count("devices/t02/status"))
    line.background.call(lambda: line.unit(2).fault("SILENT", 60))
    topic = "devices/t02/availability"
    assert topics.wait(topic, after=marks[0], parse=False) == b"offline"
    silent = topics.wait(
        "devices/t02/status", lambda d: d["availability"] == "offline", after=marks[1]
    )
    assert silent["controller"] == "unavailable" and not silent["in_sync"]
    mark = topics.count(topic)
    line.background.call(lambda: line.unit(2).fault("CLEAR"))
    assert topics.wait(topic, after=mark, parse=False) == b"online"


# --------------------------------------------------------------------------- HTTP


def get(address: tuple[str, int], path: str, method: str = "GET") -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(*address, timeout=5)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_the_http_endpoint_answers_like_patroni(line: LineRig, topics: Topics) -> None:
    active, _ = line.start_active("a", AGENT_HEALTH__PORT="0")
    standby = line.start_agent("b", AGENT_HEALTH__PORT="0")
    standby.wait_for_new(STANDBY)
    a = active.wait_for(ENDPOINT)
    b = standby.wait_for(ENDPOINT)
    at_a, at_b = (a.group(1), int(a.group(2))), (b.group(1), int(b.group(2)))
    assert a.group(1) == "127.0.0.1"  # loopback unless told otherwise

    expected = {
        "/leader": (200, 503),
        "/active": (200, 503),
        "/": (200, 503),
        "/primary": (200, 503),
        "/replica": (503, 200),
        "/standby": (503, 200),
        "/health": (200, 200),
        "/readiness": (200, 200),
        "/liveness": (200, 200),
        "/paused": (503, 503),
        "/no-such-thing": (404, 404),
    }
    for path, codes in expected.items():
        assert (get(at_a, path)[0], get(at_b, path)[0]) == codes, path
    _, body = get(at_a, "/leader")
    document = json.loads(body)
    assert document["role"] == "active" and document["instance"] == "a"
    assert document["state"] == "running" and document["line"] == LINE
    assert get(at_a, "/leader", "HEAD") == (200, b"")
    assert get(at_b, "/replica", "OPTIONS")[0] == 200
    assert get(at_a, "/leader", "POST")[0] == 405

    # Paused: still the leader (it holds the lock), and /paused says so on both.
    line.client.request("SET", f"{LINE}\\paused", b"maintenance")
    topics.wait(health_topic(LINE, "a"), lambda d: d["paused"])
    assert [get(at_a, "/paused")[0], get(at_b, "/paused")[0]] == [200, 200]
    assert get(at_a, "/leader")[0] == 200
    assert json.loads(get(at_a, "/health")[1])["state"] == "paused"
    line.client.request("DEL", f"{LINE}\\paused")

    # Without the broker, the standby could not take over: failing.
    line.broker_down()
    deadline = time.monotonic() + 10
    while get(at_b, "/health")[0] != 503:  # looked at until the agent has noticed
        assert time.monotonic() < deadline, "the standby never said it is failing"
        time.sleep(0.05)
    assert json.loads(get(at_b, "/replica")[1])["state"] == "failing"
    assert get(at_b, "/replica")[0] == 503


def test_the_endpoint_bounds_what_it_reads(line: LineRig) -> None:
    agent, _ = line.start_active("a", AGENT_HEALTH__PORT="0")
    match = agent.wait_for(ENDPOINT)
    address = (match.group(1), int(match.group(2)))
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(b"GET /" + b"x" * 10_000 + b" HTTP/1.1\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 400 ")
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(b"hello\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 400 ")
    assert get(address, "/health")[0] == 200  # and it still answers


# --------------------------------------------------------------------------- the unit


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifyListener]:
    listener = NotifyListener(tmp_path, "notify")
    try:
        yield listener
    finally:
        listener.close()


def test_the_status_line_says_the_role_and_the_sync_state(
    line: LineRig, notify: NotifyListener
) -> None:
    line.start_active("a", NOTIFY_SOCKET=notify.address, AGENT_SERIAL__PROBE_INTERVAL_S="60")
    words = f"active for line {LINE}: 4 devices, 4 in sync"
    notify.wait_for(lambda n: n.fields.get("STATUS") == words)
    line.background.call(lambda: line.unit(2).fault("SILENT", 60))
    silent = f"active for line {LINE}: 4 devices, 3 in sync, 1 not answering (t02)"
    notify.wait_for(lambda n: n.fields.get("STATUS") == silent)
