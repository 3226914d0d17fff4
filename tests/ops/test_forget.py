"""`agent forget`: a stopped instance or a decommissioned line no longer listed (and no
longer exit 1 for good), never while an agent of it is live."""

from __future__ import annotations

import threading
import time

import paho.mqtt.client as mqtt

from agent.protocol.hlc import Hlc
from tests.ops.support import (
    TIMEOUT,
    Topics,
    command,
    health_topic,
    publish_retained,
    report,
    status,
    wait_pair,
)
from tests.support.rig import STANDBY, LineRig

LINE = LineRig.LINE
PHANTOM = "floor9"


def retained(line: LineRig, topic_filter: str) -> dict[str, bytes]:
    """The retained messages on `topic_filter` now: those the broker sends on subscribing,
    known to be all once a message published after the SUBACK comes back."""
    found: dict[str, bytes] = {}
    marker = f"test/marker/{time.monotonic_ns()}"
    done = threading.Event()

    def on_message(client: object, userdata: object, msg: mqtt.MQTTMessage) -> None:
        if msg.topic == marker:
            done.set()
        elif msg.retain:
            found[msg.topic] = bytes(msg.payload)

    watcher = Topics(line.port, topic_filter, "test/marker/#")
    watcher.client.on_message = on_message
    try:
        watcher.client.publish(marker, b"x", qos=1).wait_for_publish(TIMEOUT)
        assert done.wait(TIMEOUT), "the marker never came back"
    finally:
        watcher.close()
    return found


def phantom(line: LineRig) -> None:
    """A line taken out of service: its stopped agents' health, a device's status, keys."""
    for instance in ("x", "y"):
        report(line, PHANTOM, instance, ["t91", "t92"], status="down", reason="stopped")
    publish_retained(line, "devices/t91/status", b'{"device":"t91","line":"floor9"}')
    publish_retained(line, "devices/t91/availability", b"offline")
    for key, value in (
        (f"{PHANTOM}\\paused", "rewiring"),
        ("t91\\line", PHANTOM),
        ("t92\\line", "floor7"),  # moved to another line since: not ours to delete
        ("t91\\setPoint", "21.0"),
    ):
        assert line.client.request("SET", key, value).payload == b"+OK\r\n"
    # Written by its last active, fenced with its lease: deleted only with a newer token.
    lease = str(Hlc(time.time_ns() // 1_000_000 - 60_000, 0, "statestore"))
    written = line.client.request("SET", f"{PHANTOM}\\history", "[]", ft=lease)
    assert written.payload == b"+OK\r\n"


def test_a_decommissioned_line_is_forgotten_and_a_live_one_is_not(
    line: LineRig, topics: Topics
) -> None:
    line.start_active("a")
    line.start_agent("b").wait_for_new(STANDBY)
    wait_pair(topics, LINE, "a", "b")
    phantom(line)
    code, every = status(line)
    assert code == 1 and [r["line"] for r in every["lines"]] == [LINE, PHANTOM]

    typo = command(line, "forget", "floor09")
    assert typo.returncode == 7 and "(did you mean floor9?)" in typo.stderr
    live = command(line, "forget", LINE)
    assert live.returncode == 1
    assert "line floor3 has live agents (a holds the lock; b is standby, heard" in live.stderr
    assert command(line, "forget", LINE, "b").returncode == 1  # live too
    assert command(line, "forget", "floor3\\x").returncode == 2

    done = command(line, "forget", PHANTOM)
    assert done.returncode == 0, done.stderr
    assert "the retained health of 2 instance(s) and the status of 2 device(s) cleared" in (
        done.stdout
    )
    assert retained(line, f"agents/{PHANTOM}/#") == {}
    assert retained(line, "devices/t91/#") == {}
    for key in (f"{PHANTOM}\\paused", f"{PHANTOM}\\history", "t91\\line"):
        assert line.store_value(key) is None, key
    assert line.store_value("t92\\line") == b"floor7"
    assert line.store_value("t91\\setPoint") == b"21.0"  # the building's, kept
    code, every = status(line)
    assert code == 0 and [r["line"] for r in every["lines"]] == [LINE]
    assert (line.store_value(f"{LINE}\\lock") or b"").startswith(b"a#")  # untouched


def test_a_stopped_instance_is_forgotten(line: LineRig, topics: Topics) -> None:
    line.start_active("a")
    standby = line.start_agent("b")
    standby.wait_for_new(STANDBY)
    third = line.start_agent("c")
    third.wait_for_new(STANDBY)
    wait_pair(topics, LINE, "a", "c")
    third.stop()
    topics.wait(health_topic(LINE, "c"), lambda d: d["status"] == "down")
    assert command(line, "forget", LINE, "cc").returncode == 7
    done = command(line, "forget", LINE, "c")
    assert done.returncode == 0, done.stderr
    assert retained(line, health_topic(LINE, "c")) == {}
    code, document = status(line, LINE)
    assert code == 0 and [r["instance"] for r in document["lines"][0]["instances"]] == ["a", "b"]
