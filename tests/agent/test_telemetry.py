"""Telemetry on the wire, read with paho (not our client), and `telemetry.build` alone."""

from __future__ import annotations

import json
import queue
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from agent.protocol.hlc import Hlc
from agent.runtime import telemetry
from tests.support.rig import DEVICE, STANDBY, Rig

TOPIC = f"devices/{DEVICE}/telemetry"
ERROR_COUNTERS = {
    "invalid_remote_values",
    "controller_errors",
    "garbled_replies",
    "store_errors",
    "fenced_writes_rejected",
    "not_authorized",
    "lock_losses",
}
FIELDS = {
    "device",
    "line",
    "instance",
    "role",
    "setpoint",
    "temperature",
    "output",
    "mode",
    "controller",
    "fencing_token",
    "last_sync_time",
    "last_sync_version",
    "errors",
    "slow_ms",
    "points",
    "changes",
}
READINGS = ("setpoint", "temperature", "output", "mode", "controller", "fencing_token")
CLOUDEVENTS = ("specversion", "type", "source", "id", "time")


@dataclass(frozen=True)
class Telemetry:
    received_at: datetime
    body: dict[str, object]
    qos: int
    retain: bool
    content_type: str | None
    expiry_s: int | None
    user_properties: dict[str, str]
    property_names: list[str]


class TelemetrySubscriber:
    def __init__(self, port: int) -> None:
        self.messages: queue.Queue[Telemetry] = queue.Queue()
        self._subscribed: queue.Queue[int] = queue.Queue()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"telemetry-reader-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda c, u, mid, codes, p: self._subscribed.put(mid)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        _, mid = self.client.subscribe(TOPIC, qos=1)
        assert self._subscribed.get(timeout=5) == mid

    def _on_message(self, client: object, userdata: object, msg: mqtt.MQTTMessage) -> None:
        props = msg.properties
        pairs = list(getattr(props, "UserProperty", None) or [])
        self.messages.put(
            Telemetry(
                received_at=datetime.now(UTC),
                body=json.loads(msg.payload),
                qos=msg.qos,
                retain=bool(msg.retain),
                content_type=getattr(props, "ContentType", None),
                expiry_s=getattr(props, "MessageExpiryInterval", None),
                user_properties=dict(pairs),
                property_names=[name for name, _ in pairs],
            )
        )

    def wait_for(self, predicate: Callable[[Telemetry], bool], timeout: float = 10.0) -> Telemetry:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no such telemetry message in time")
            try:
                message = self.messages.get(timeout=remaining)
            except queue.Empty:
                continue
            if predicate(message):
                return message

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def subscriber(rig: Rig) -> Iterator[TelemetrySubscriber]:
    reader = TelemetrySubscriber(rig.port)
    try:
        yield reader
    finally:
        reader.close()


def from_instance(instance: str, role: str | None = None) -> Callable[[Telemetry], bool]:
    def match(message: Telemetry) -> bool:
        body = message.body
        return body["instance"] == instance and (role is None or body["role"] == role)

    return match


def check_envelope(message: Telemetry, instance: str) -> None:
    assert message.content_type == "application/json"
    assert message.qos == 1
    assert not message.retain
    # The agent asks for three intervals (1 s here); the broker counts down from there.
    assert message.expiry_s is not None and 1 <= message.expiry_s <= 3
    assert sorted(message.property_names) == sorted(CLOUDEVENTS)  # each exactly once
    props = message.user_properties
    assert props["specversion"] == "1.0"
    assert props["type"] == "agent.telemetry.v1"
    assert props["source"] == f"agent/{DEVICE}/{instance}"
    uuid.UUID(props["id"])
    assert props["time"].endswith("Z")
    sent = datetime.fromisoformat(props["time"].replace("Z", "+00:00"))
    assert abs(message.received_at - sent) < timedelta(seconds=5)


def check_body(message: Telemetry, instance: str, role: str) -> None:
    body = message.body
    assert set(body) == FIELDS
    assert body["device"] == DEVICE
    assert body["instance"] == instance
    assert body["role"] == role
    errors = body["errors"]
    assert isinstance(errors, dict) and set(errors) == ERROR_COUNTERS
    assert all(isinstance(count, int) and count >= 0 for count in errors.values())


def test_active_and_standby_both_publish(rig: Rig, subscriber: TelemetrySubscriber) -> None:
    _, token = rig.start_active("a")
    rig.start_agent("b").wait_for_new(STANDBY)

    active = subscriber.wait_for(from_instance("a", "active"))
    standby = subscriber.wait_for(from_instance("b", "standby"))
    check_envelope(active, "a")
    check_envelope(standby, "b")
    check_body(active, "a", "active")
    check_body(standby, "b", "standby")

    body = active.body
    assert body["setpoint"] == 20.0
    assert isinstance(body["temperature"], float)
    assert isinstance(body["output"], int) and 0 <= body["output"] <= 100
    assert isinstance(body["mode"], str) and body["mode"]
    assert body["controller"] == "ok"
    # Renewals move the token on; it never goes back.
    assert isinstance(body["fencing_token"], str)
    assert Hlc.parse(body["fencing_token"]) >= Hlc.parse(token)
    assert isinstance(body["last_sync_version"], str)
    Hlc.parse(body["last_sync_version"])
    assert isinstance(body["last_sync_time"], str) and body["last_sync_time"].endswith("Z")
    datetime.fromisoformat(body["last_sync_time"].replace("Z", "+00:00"))
    assert body["errors"] == dict.fromkeys(ERROR_COUNTERS, 0)

    # The standby holds no controller: no readings, no token.
    assert all(standby.body[name] is None for name in READINGS), standby.body

    # Every message is its own event.
    later = subscriber.wait_for(from_instance("a"))
    assert later.user_properties["id"] != active.user_properties["id"]


def test_invalid_remote_value_is_counted(rig: Rig, subscriber: TelemetrySubscriber) -> None:
    agent, _ = rig.start_active("a")
    before = subscriber.wait_for(from_instance("a", "active")).body["errors"]
    assert isinstance(before, dict)
    rig.remote_set(b"99")
    agent.wait_for_new(re.compile(r"setPoint .* refused"))

    def counted(message: Telemetry) -> bool:
        errors = message.body["errors"]
        return (
            from_instance("a", "active")(message)
            and isinstance(errors, dict)
            and errors["invalid_remote_values"] > before["invalid_remote_values"]
        )

    after = subscriber.wait_for(counted)
    assert after.body["errors"] == {**before, "invalid_remote_values": 1}
    assert rig.device_writes() == []


# --------------------------------------------------------------------------- build()


def snapshot(**changes: object) -> telemetry.Snapshot:
    fields: dict[str, object] = {
        "device": "thermostat-1",
        "line": "thermostat-1",
        "instance": "a",
        "role": "active",
        "setpoint": 21.5,
        "temperature": 19.8,
        "output": 40,
        "mode": "heating",
        "controller": "ok",
        "fencing_token": "001700000000000:00001:statestore",
        "last_sync_time": "2026-01-02T03:04:05.000Z",
        "last_sync_version": "001700000000001:00000:statestore",
        "errors": dict.fromkeys(sorted(ERROR_COUNTERS), 0),
    }
    fields.update(changes)
    return telemetry.Snapshot(**fields)  # type: ignore[arg-type]


def test_build_payload_is_the_snapshot_as_compact_json() -> None:
    shot = snapshot()
    payload, _ = telemetry.build(shot, now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert json.loads(payload) == asdict(shot)
    assert b" " not in payload  # compact separators
    assert telemetry.CONTENT_TYPE == "application/json"


def test_build_properties_are_cloudevents_attributes() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC)
    _, properties = telemetry.build(snapshot(instance="b", role="standby"), now=now)
    assert [name for name, _ in properties] == list(CLOUDEVENTS)
    props = dict(properties)
    assert props["specversion"] == "1.0"
    assert props["type"] == telemetry.EVENT_TYPE == "agent.telemetry.v1"
    assert props["source"] == "agent/thermostat-1/b"
    assert uuid.UUID(props["id"]).version == 4
    assert props["time"] == "2026-01-02T03:04:05.678Z"


def test_build_gives_each_message_its_own_id_and_the_current_time() -> None:
    shot = snapshot()
    ids = {dict(telemetry.build(shot)[1])["id"] for _ in range(50)}
    assert len(ids) == 50
    stamp = dict(telemetry.build(shot)[1])["time"]
    sent = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert abs(datetime.now(UTC) - sent) < timedelta(seconds=5)


def test_build_keeps_the_standby_nulls() -> None:
    nulls = dict.fromkeys(READINGS)
    payload, _ = telemetry.build(snapshot(role="standby", **nulls))
    body = json.loads(payload)
    assert all(body[name] is None for name in READINGS)


def test_iso_time() -> None:
    assert telemetry.iso_time(None) is None
    assert telemetry.iso_time(0) == "1970-01-01T00:00:00.000Z"
    assert telemetry.iso_time(1_767_323_045.25) == "2026-01-02T03:04:05.250Z"
