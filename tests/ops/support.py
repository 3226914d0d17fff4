"""What the operator-command tests share: the commands run as processes against a rig's
store, and an MQTT subscriber (paho, not our session) that keeps what the agents publish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt

from tests.support.rig import Rig

TIMEOUT = 10.0


def command(
    rig: Rig, name: str, *args: str, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """`agent NAME ARGS` against the rig's broker (unless ARGS say otherwise), with nothing
    from this environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            name,
            "--host",
            "127.0.0.1",
            "--port",
            str(rig.port),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def status(rig: Rig, *args: str) -> tuple[int, dict[str, Any]]:
    """`agent status ARGS --json`: the exit code and the document."""
    result = command(rig, "status", *args, "--json")
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


class Topics:
    """Every message on some topics (retained ones included), kept by topic, waited on."""

    def __init__(self, port: int, *filters: str) -> None:
        self.messages: dict[str, list[tuple[float, bytes, bool]]] = {}
        self._changed = threading.Condition()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"topics-{time.monotonic_ns()}",
            protocol=mqtt.MQTTv5,
        )
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        for topic_filter in filters:
            self._subscribed.clear()
            self.client.subscribe(topic_filter, qos=1)
            assert self._subscribed.wait(TIMEOUT), f"no SUBACK for {topic_filter}"

    def _on_message(self, client: object, userdata: object, msg: mqtt.MQTTMessage) -> None:
        with self._changed:
            entry = (time.monotonic(), bytes(msg.payload), bool(msg.retain))
            self.messages.setdefault(msg.topic, []).append(entry)
            self._changed.notify_all()

    def wait(
        self,
        topic: str,
        predicate: Callable[[Any], bool] = lambda _: True,
        *,
        after: int = 0,
        timeout: float = TIMEOUT,
        parse: bool = True,
    ) -> Any:
        """The first message on `topic` (from index `after`) that satisfies `predicate`:
        its JSON document, or its payload with parse=False."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for _, payload, _ in self.messages.get(topic, [])[after:]:
                    value = json.loads(payload) if parse else payload
                    if predicate(value):
                        return value
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    seen = self.messages.get(topic, [])[-5:]
                    raise AssertionError(f"no such message on {topic}; last: {seen}")
                self._changed.wait(remaining)

    def count(self, topic: str) -> int:
        with self._changed:
            return len(self.messages.get(topic, []))

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def health_topic(line: str, instance: str) -> str:
    return f"agents/{line}/{instance}/health"


def wait_pair(topics: Topics, line: str, active: str, standby: str) -> None:
    """Both instances have said their roles."""
    topics.wait(health_topic(line, active), lambda d: d["role"] == "active")
    topics.wait(health_topic(line, standby), lambda d: d["role"] == "standby")


def wait_in_sync(topics: Topics, devices: list[str], by: str | None = None) -> None:
    """The active (`by`, if given) says, in its latest word or a later one, that every
    device is in sync."""

    def synced(document: dict[str, Any]) -> bool:
        return bool(document["in_sync"]) and by in (None, document["instance"])

    for device in devices:
        topic = f"devices/{device}/status"
        topics.wait(topic, synced, after=max(0, topics.count(topic) - 1))


def report(rig: Rig, line: str, instance: str, devices: list[str], **changes: Any) -> None:
    """A retained health document as an agent of `line` publishes it (without an agent:
    what the operator commands read of the agents), acknowledged by the broker."""
    document = {
        "status": "up",
        "pid": 4242,
        "host": "gw-test",
        "time": time.time(),
        "line": line,
        "instance": instance,
        "role": "standby",
        "state": "running",
        "paused": False,
        "ttl_ms": 1500,
        "heartbeat_s": 5.0,
        "devices": devices,
    }
    document.update(changes)
    publish_retained(rig, health_topic(line, instance), json.dumps(document).encode())


def publish_retained(rig: Rig, topic: str, payload: bytes) -> None:
    info = rig.client.client.publish(topic, payload, qos=1, retain=True)
    info.wait_for_publish(TIMEOUT)
    assert info.is_published(), f"no PUBACK for {topic} within {TIMEOUT} s"


def wait_change(
    topics: Topics, device: str, source: str, point: str = "setPoint", value: str | None = None
) -> dict[str, Any]:
    """The active's status of `device` once `point`'s last change is from `source` (and to
    `value`, if given): that change (value, source, at, version)."""

    def said(document: dict[str, Any]) -> bool:
        change = (document.get("changes") or {}).get(point) or {}
        return change.get("source") == source and value in (None, change.get("value"))

    document: dict[str, Any] = topics.wait(f"devices/{device}/status", said, timeout=20)
    change: dict[str, Any] = document["changes"][point]
    return change
