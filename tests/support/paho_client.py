"""A state store client built on paho-mqtt, a library that is not ours, for wire tests.

It speaks the protocol by hand so that tests see the bytes and properties exactly.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.protocol import topics
from agent.protocol.hlc import Hlc
from agent.protocol.resp3 import encode_request

TIMEOUT = 5.0


def now_ts(node: str = "paho", offset_ms: int = 0) -> str:
    return str(Hlc(time.time_ns() // 1_000_000 + offset_ms, 0, node))


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    correlation_data: bytes | None
    content_type: str | None
    user_properties: list[tuple[str, str]] = field(default_factory=list)

    def prop(self, name: str) -> str | None:
        return next((v for k, v in self.user_properties if k == name), None)


class PahoStoreClient:
    def __init__(
        self,
        host: str,
        port: int,
        client_id: str,
        *,
        keepalive: int = 30,
        subscribe: bool = True,
        configure: Callable[[mqtt.Client], object] | None = None,
    ) -> None:
        """``configure`` sets up the paho client before it connects (TLS, user name...)."""
        self.client_id = client_id
        self.response_topic = topics.response_topic(client_id)
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        self._pending: dict[bytes, queue.Queue[Received]] = {}
        self.notifications: queue.Queue[Received] = queue.Queue()
        self.other: queue.Queue[Received] = queue.Queue()
        self.disconnected = threading.Event()
        self.disconnect_reason: object = None
        self._connected = threading.Event()
        self._subacks: queue.Queue[int] = queue.Queue()
        self.client.on_message = self._on_message
        self.client.on_connect = lambda *a: self._connected.set()
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = lambda c, u, mid, codes, p: self._subacks.put(mid)
        if configure is not None:
            configure(self.client)
        self.client.connect(host, port, keepalive=keepalive)
        sock = self.client.socket()
        if sock is not None:  # else each request after a response waits for delayed ACKs
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client.loop_start()
        assert self._connected.wait(TIMEOUT), "no CONNACK"
        if subscribe:
            self.subscribe(self.response_topic)
            self.subscribe(topics.notify_filter(client_id))

    def subscribe(self, topic: str) -> None:
        _, mid = self.client.subscribe(topic, qos=1)
        while self._subacks.get(timeout=TIMEOUT) != mid:
            pass

    def _on_disconnect(
        self, client: object, userdata: object, flags: object, reason: object, properties: object
    ) -> None:
        self.disconnect_reason = reason
        self.disconnected.set()

    def _on_message(self, client: object, userdata: object, msg: mqtt.MQTTMessage) -> None:
        props = msg.properties
        received = Received(
            msg.topic,
            msg.payload,
            msg.qos,
            getattr(props, "CorrelationData", None),
            getattr(props, "ContentType", None),
            list(getattr(props, "UserProperty", []) or []),
        )
        if received.correlation_data in self._pending:
            self._pending[received.correlation_data].put(received)
        elif "/command/notify/" in msg.topic:
            self.notifications.put(received)
        else:
            self.other.put(received)

    def send(
        self,
        *args: bytes | str,
        ts: str | None = "now",
        ft: str | None = None,
        qos: int = 1,
        response_topic: str | None = "own",
        correlation: bytes | None = None,
        payload: bytes | None = None,
        extra_properties: list[tuple[str, str]] | None = None,
        acknowledged: bool = True,
    ) -> queue.Queue[Received]:
        """Publishes a request; returns the queue its response will arrive on. Waits for
        the PUBACK unless `acknowledged` is false (a request the broker answers otherwise)."""
        correlation = os.urandom(16) if correlation is None else correlation
        properties = Properties(PacketTypes.PUBLISH)
        if response_topic is not None:
            properties.ResponseTopic = (
                self.response_topic if response_topic == "own" else response_topic
            )
        if correlation:
            properties.CorrelationData = correlation
        properties.ContentType = topics.CONTENT_TYPE
        properties.MessageExpiryInterval = 10
        user = [(topics.SOURCE_ID, self.client_id), (topics.PROTOCOL_VERSION_PROPERTY, "1.0")]
        if ts is not None:
            user.append((topics.TIMESTAMP, now_ts(self.client_id) if ts == "now" else ts))
        if ft is not None:
            user.append((topics.FENCING_TOKEN, ft))
        properties.UserProperty = user + (extra_properties or [])
        waiter: queue.Queue[Received] = queue.Queue()
        self._pending[correlation] = waiter
        if payload is None:
            payload = encode_request([a.encode() if isinstance(a, str) else a for a in args])
        info = self.client.publish(topics.INVOKE_TOPIC, payload, qos=qos, properties=properties)
        if qos and acknowledged:
            info.wait_for_publish(TIMEOUT)
            # wait_for_publish() returns quietly on a timeout: say so instead.
            assert info.is_published(), f"no PUBACK within {TIMEOUT} s"
        return waiter

    def request(self, *args: bytes | str, **kwargs: object) -> Received:
        return self.send(*args, **kwargs).get(timeout=TIMEOUT)  # type: ignore[arg-type]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def drop(self) -> None:
        """Closes the socket without DISCONNECT, as a crashed client would."""
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            sock.close()
