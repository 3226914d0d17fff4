"""The embedded broker, driven by paho-mqtt (a client that is not ours) and raw sockets.

Negative checks ("X is not delivered") publish a marker after X on the same connection and
assert the marker is what arrives first: MQTT keeps per-publisher order, so no sleeping.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from agent.emulator import mqtt_packets as mp
from agent.emulator.broker import Broker, DisconnectReason, Message
from tests.emulator.conftest import TIMEOUT, BrokerThread, EventLog, PahoClient, RawClient

PahoFactory = Callable[..., PahoClient]
RawFactory = Callable[[int], RawClient]


def publish_properties(**values: object) -> PahoProperties:
    properties = PahoProperties(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


def connected(paho_factory: PahoFactory, port: int, client_id: str, **kwargs: object) -> PahoClient:
    client = paho_factory(port, client_id, **kwargs)
    _, reason_code, _ = client.connect()
    assert reason_code == 0
    return client


def assert_next_is_marker(client: PahoClient, marker_topic: str) -> None:
    message = client.next_message()
    assert message.topic == marker_topic, f"unexpected {message.topic}: {message.payload!r}"


def assert_broker_serves(paho_factory: PahoFactory, port: int) -> None:
    client = connected(paho_factory, port, "health-check")
    assert client.subscribe("health") == [1]
    client.publish("health", b"ok")
    assert client.next_message().payload == b"ok"


# ---- CONNECT / CONNACK ------------------------------------------------------------------------


def test_connack_advertises_capabilities(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    client = paho_factory(mqtt_broker.port, "fields")
    connect_properties = PahoProperties(PacketTypes.CONNECT)
    connect_properties.SessionExpiryInterval = 3600
    flags, reason_code, properties = client.connect(properties=connect_properties)

    assert reason_code == 0
    assert flags.session_present is False
    assert properties.SessionExpiryInterval == 0
    assert properties.ReceiveMaximum == 100
    assert properties.MaximumQoS == 1
    assert properties.RetainAvailable == 1
    assert properties.WildcardSubscriptionAvailable == 1
    assert properties.SubscriptionIdentifierAvailable == 0
    assert properties.SharedSubscriptionAvailable == 0
    assert properties.TopicAliasMaximum == 0
    assert not hasattr(properties, "AssignedClientIdentifier")
    assert not hasattr(properties, "ServerKeepAlive")
    assert mqtt_broker.call(mqtt_broker.broker.connected_clients) == {"fields"}


def test_empty_client_id_gets_an_assigned_identifier(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    _, reason_code, properties = paho_factory(mqtt_broker.port, "").connect()
    assert reason_code == 0
    assigned = properties.AssignedClientIdentifier
    assert assigned
    assert mqtt_broker.call(mqtt_broker.broker.connected_clients) == {assigned}


def test_mqtt_311_is_refused_with_a_311_connack(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory, raw_factory: RawFactory
) -> None:
    # paho 3.1.1 takes return code 1 as "try 3.1"; with reconnects off it just gives up.
    client_311 = paho_factory(mqtt_broker.port, "v311", protocol=paho.MQTTv311)
    client_311.client.connect("127.0.0.1", mqtt_broker.port)
    client_311.client.loop_start()
    client_311.disconnects.wait_for(lambda _: True)
    assert client_311.connacks.items == []
    # paho 3.1 has nowhere to go and reports the refusal.
    client_31 = paho_factory(mqtt_broker.port, "v31", protocol=paho.MQTTv31)
    _, reason_code, _ = client_31.connect()
    assert reason_code.is_failure
    assert reason_code.getName() == "Unsupported protocol version"

    # Byte for byte: CONNACK, remaining length 2, no session, return code 1; then closed.
    raw = raw_factory(mqtt_broker.port)
    connect_311 = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04test"
    raw.send_bytes(connect_311)
    assert raw.receive_raw_until_closed() == b"\x20\x02\x00\x01"
    assert mqtt_broker.disconnects.items == []  # never connected, so no hook


@pytest.mark.parametrize(
    ("connect", "reason_code"),
    [
        (
            mp.Connect("auth", properties=mp.Properties(authentication_method="SCRAM-SHA-1")),
            mp.ReasonCode.BAD_AUTHENTICATION_METHOD,
        ),
        (mp.Connect("will", will=mp.Will("w", b"", qos=2)), mp.ReasonCode.QOS_NOT_SUPPORTED),
        (mp.Connect("will", will=mp.Will("w/#", b"")), mp.ReasonCode.TOPIC_NAME_INVALID),
    ],
)
def test_unsupported_connects_are_refused(
    mqtt_broker: BrokerThread, raw_factory: RawFactory, connect: mp.Connect, reason_code: int
) -> None:
    raw = raw_factory(mqtt_broker.port)
    raw.send(connect)
    assert raw.expect(mp.Connack).reason_code == reason_code
    raw.expect_closed()
    assert mqtt_broker.call(mqtt_broker.broker.connected_clients) == set()


def test_username_and_password_are_accepted(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    client = paho_factory(mqtt_broker.port, "user")
    client.client.username_pw_set("anyone", "anything")
    assert client.connect()[1] == 0


def test_server_keep_alive_caps_the_client(
    broker_factory: Callable[..., BrokerThread], paho_factory: PahoFactory
) -> None:
    broker = broker_factory(max_keepalive_s=1)
    _, _, properties = paho_factory(broker.port, "lazy").connect(keepalive=60)
    assert properties.ServerKeepAlive == 1


# ---- PUBLISH forwarding -----------------------------------------------------------------------


@pytest.mark.parametrize("correlation_data", [b"", bytes(range(256)) + bytes(44), b"\x00\xff"])
def test_every_publish_property_is_forwarded_intact(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory, correlation_data: bytes
) -> None:
    subscriber = connected(paho_factory, mqtt_broker.port, "sub")
    assert subscriber.subscribe("props/#") == [1]
    publisher = connected(paho_factory, mqtt_broker.port, "pub")
    user_properties = [("dup", "1"), ("other", "x"), ("dup", "2"), ("dup", "1")]
    publisher.publish(
        "props/a",
        b"\x00payload\xff",
        properties=publish_properties(
            ResponseTopic="replies/pub",
            CorrelationData=correlation_data,
            ContentType="application/octet-stream",
            PayloadFormatIndicator=0,
            MessageExpiryInterval=60,
            UserProperty=user_properties,
        ),
    )

    message = subscriber.next_message()
    assert message.topic == "props/a"
    assert message.payload == b"\x00payload\xff"
    assert message.qos == 1
    received = message.properties
    assert received.ResponseTopic == "replies/pub"
    assert received.CorrelationData == correlation_data
    assert received.ContentType == "application/octet-stream"
    assert received.PayloadFormatIndicator == 0
    assert received.MessageExpiryInterval in (59, 60)  # the time left is forwarded
    assert received.UserProperty == user_properties


def test_qos_1_is_acked_to_the_publisher_and_delivered_at_qos_1(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    subscriber = connected(paho_factory, mqtt_broker.port, "sub")
    subscriber.subscribe("q/1", qos=1)
    subscriber.subscribe("q/0", qos=0)
    publisher = connected(paho_factory, mqtt_broker.port, "pub")
    acks: EventLog[int] = EventLog()
    publisher.client.on_publish = lambda _c, _u, mid, rc, _p: acks.append(rc.value)

    publisher.publish("q/1", b"one", qos=1)  # waits for the PUBACK
    assert acks.items == [0]
    message = subscriber.next_message()
    assert (message.topic, message.qos) == ("q/1", 1)

    # Delivered QoS is the lower of publish and subscription QoS.
    publisher.publish("q/0", b"capped", qos=1)
    assert subscriber.next_message().qos == 0
    publisher.publish("q/1", b"qos0", qos=0)
    assert subscriber.next_message().qos == 0


def test_broker_publish_reaches_subscribers_but_not_intercepts(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    intercepted: EventLog[tuple[str, Message]] = EventLog()
    mqtt_broker.call(mqtt_broker.broker.intercept, "out/#", lambda *e: intercepted.append(e))
    subscriber = connected(paho_factory, mqtt_broker.port, "sub")
    subscriber.subscribe("out/#")

    mqtt_broker.call(
        mqtt_broker.broker.publish,
        Message(
            "out/x",
            b"from broker",
            qos=1,
            correlation_data=b"\x01",
            user_properties=[("a", "1"), ("a", "2")],
        ),
    )
    message = subscriber.next_message()
    assert (message.payload, message.qos) == (b"from broker", 1)
    assert message.properties.CorrelationData == b"\x01"
    assert message.properties.UserProperty == [("a", "1"), ("a", "2")]
    assert intercepted.items == []


# ---- subscriptions ----------------------------------------------------------------------------


def test_wildcards_and_dollar_topics(mqtt_broker: BrokerThread, paho_factory: PahoFactory) -> None:
    everything = connected(paho_factory, mqtt_broker.port, "everything")
    everything.subscribe("#")
    plus = connected(paho_factory, mqtt_broker.port, "plus")
    plus.subscribe("sensors/+/temp")
    system = connected(paho_factory, mqtt_broker.port, "system")
    system.subscribe("$SYS/#")
    publisher = connected(paho_factory, mqtt_broker.port, "pub")

    publisher.publish("$SYS/broker/load", b"sys")
    publisher.publish("sensors/kitchen/temp", b"21")
    publisher.publish("sensors/kitchen/humidity", b"40")
    publisher.publish("marker", b"")

    assert system.next_message().topic == "$SYS/broker/load"
    assert [everything.next_message().topic for _ in range(3)] == [
        "sensors/kitchen/temp",
        "sensors/kitchen/humidity",
        "marker",
    ]  # "#" skipped the $SYS topic
    assert plus.next_message().topic == "sensors/kitchen/temp"


def test_overlapping_subscriptions_deliver_once_at_the_highest_qos(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    client = connected(paho_factory, mqtt_broker.port, "overlap")
    client.subscribe("a/#", qos=0)
    client.subscribe("a/+", qos=1)
    client.subscribe("marker")
    client.publish("a/b", b"once")
    client.publish("marker")

    message = client.next_message()
    assert (message.topic, message.qos) == ("a/b", 1)
    assert_next_is_marker(client, "marker")


def test_unsubscribe(mqtt_broker: BrokerThread, paho_factory: PahoFactory) -> None:
    client = connected(paho_factory, mqtt_broker.port, "unsub")
    client.subscribe("gone")
    client.subscribe("marker")
    assert client.unsubscribe("gone") == [0x00]
    assert client.unsubscribe("gone") == [0x11]  # no subscription existed
    client.publish("gone", b"nobody listens")
    client.publish("marker")
    assert_next_is_marker(client, "marker")


def test_invalid_and_shared_filters_are_refused_in_suback(
    mqtt_broker: BrokerThread, raw_factory: RawFactory
) -> None:
    raw = raw_factory(mqtt_broker.port)
    raw.connect("filters")
    raw.send(
        mp.Subscribe(
            1,
            [
                mp.Subscription("a/#/b", 1),
                mp.Subscription("a+", 1),
                mp.Subscription("$share/group/a", 1),
                mp.Subscription("ok/+", 2),
            ],
        )
    )
    suback = raw.expect(mp.Suback)
    assert suback.reason_codes == [0x8F, 0x8F, 0x9E, 1]  # QoS 2 granted as 1


def test_no_local_suppresses_own_messages(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    client = connected(paho_factory, mqtt_broker.port, "echo")
    client.subscribe("chat", options=paho.SubscribeOptions(qos=1, noLocal=True))
    client.subscribe("marker")
    client.publish("chat", b"mine")
    client.publish("marker")
    assert_next_is_marker(client, "marker")


def test_retained_messages(mqtt_broker: BrokerThread, paho_factory: PahoFactory) -> None:
    publisher = connected(paho_factory, mqtt_broker.port, "pub")
    publisher.publish(
        "state/a", b"on", retain=True, properties=publish_properties(ContentType="text/plain")
    )
    publisher.publish("state/b", b"off", retain=True)

    late = connected(paho_factory, mqtt_broker.port, "late")
    late.subscribe("state/a")
    message = late.next_message()
    assert (message.topic, message.payload, message.retain) == ("state/a", b"on", True)
    assert message.properties.ContentType == "text/plain"

    publisher.publish("state/b", b"", retain=True)  # an empty retained payload deletes it
    later = connected(paho_factory, mqtt_broker.port, "later")
    later.subscribe("state/b")
    publisher.publish("state/b", b"live")
    message = later.next_message()
    assert (message.payload, message.retain) == (b"live", False)


# ---- flow control -----------------------------------------------------------------------------


def test_subscriber_with_receive_maximum_2_gets_all_50_messages(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    subscriber = paho_factory(mqtt_broker.port, "narrow")
    connect_properties = PahoProperties(PacketTypes.CONNECT)
    connect_properties.ReceiveMaximum = 2
    subscriber.connect(properties=connect_properties)
    subscriber.subscribe("flood")
    publisher = connected(paho_factory, mqtt_broker.port, "flood-pub")
    infos = [publisher.client.publish("flood", str(n).encode(), qos=1) for n in range(50)]
    for info in infos:
        info.wait_for_publish(TIMEOUT)

    payloads = [subscriber.next_message().payload for _ in range(50)]
    assert payloads == [str(n).encode() for n in range(50)]


def test_outbound_window_waits_for_pubacks(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory, raw_factory: RawFactory
) -> None:
    raw = raw_factory(mqtt_broker.port)
    raw.connect("window", properties=mp.Properties(receive_maximum=2))
    raw.send(mp.Subscribe(1, [mp.Subscription("w", 1)]))
    raw.expect(mp.Suback)
    publisher = connected(paho_factory, mqtt_broker.port, "w-pub")
    for n in range(5):
        publisher.publish("w", bytes([n]))  # each PUBACK means the broker has routed it

    first, second = raw.expect(mp.Publish), raw.expect(mp.Publish)
    assert [first.payload, second.payload] == [b"\x00", b"\x01"]
    raw.assert_silent(0.2)  # the window of 2 is full
    assert first.packet_id is not None and second.packet_id is not None
    raw.send(mp.Puback(first.packet_id))
    third = raw.expect(mp.Publish)
    assert third.payload == b"\x02"
    assert third.packet_id not in (second.packet_id, None)
    raw.assert_silent(0.2)
    raw.send(mp.Puback(second.packet_id), mp.Puback(third.packet_id))
    assert [raw.expect(mp.Publish).payload for _ in range(2)] == [b"\x03", b"\x04"]


# ---- keep-alive -------------------------------------------------------------------------------


def test_keepalive_timeout_is_enforced_and_reported(
    mqtt_broker: BrokerThread, raw_factory: RawFactory
) -> None:
    raw = raw_factory(mqtt_broker.port)
    raw.connect("sleepy", keep_alive=1)
    # Silent client: after 1.5 s the broker sends DISCONNECT 0x8D and closes.
    disconnect = raw.expect(mp.Disconnect, timeout=1.5 + TIMEOUT)
    assert disconnect.reason_code == mp.ReasonCode.KEEP_ALIVE_TIMEOUT
    raw.expect_closed()
    assert mqtt_broker.disconnects.wait_for(lambda e: e[0] == "sleepy") == (
        "sleepy",
        DisconnectReason.KEEPALIVE_TIMEOUT,
    )


def test_packets_reset_the_keepalive_timer(
    mqtt_broker: BrokerThread, raw_factory: RawFactory
) -> None:
    raw = raw_factory(mqtt_broker.port)
    raw.connect("awake", keep_alive=1)
    # Four pings 0.4 s apart outlive the 1.5 s a silent client would get.
    for _ in range(4):
        raw.assert_silent(0.4)
        raw.send(mp.Pingreq())
        raw.expect(mp.Pingresp)
    assert mqtt_broker.call(mqtt_broker.broker.connected_clients) == {"awake"}


# ---- session takeover, clean start ------------------------------------------------------------


def test_session_takeover(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory, raw_factory: RawFactory
) -> None:
    events: EventLog[tuple[str, ...]] = EventLog()
    broker = mqtt_broker.broker
    mqtt_broker.call(broker.on_disconnect, lambda cid, reason: events.append((cid, reason.value)))
    mqtt_broker.call(broker.intercept, "takeover/#", lambda cid, msg: events.append((cid, "pub")))

    old = connected(paho_factory, mqtt_broker.port, "twin")
    old.subscribe("old-only")
    # The new connection's CONNECT and first PUBLISH arrive in one segment.
    new = raw_factory(mqtt_broker.port)
    new.send(mp.Connect("twin"), mp.Publish("takeover/x", b"", 1, packet_id=1))
    assert new.expect(mp.Connack).session_present is False
    assert new.expect(mp.Puback).packet_id == 1

    assert old.disconnects.wait_for(lambda _: True).value == mp.ReasonCode.SESSION_TAKEN_OVER
    assert events.items == [("twin", "taken_over"), ("twin", "pub")]
    assert mqtt_broker.call(broker.connected_clients) == {"twin"}

    # The old connection's subscription did not carry over.
    new.send(mp.Subscribe(2, [mp.Subscription("marker", 1)]))
    new.expect(mp.Suback)
    publisher = connected(paho_factory, mqtt_broker.port, "pub")
    publisher.publish("old-only", b"stale")
    publisher.publish("marker", b"")
    assert new.expect(mp.Publish).topic == "marker"


def test_clean_start_does_not_resurrect_subscriptions(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    first = connected(paho_factory, mqtt_broker.port, "again")
    first.subscribe("before")
    first.close()
    mqtt_broker.disconnects.wait_for(lambda e: e == ("again", DisconnectReason.CLEAN))

    second = paho_factory(mqtt_broker.port, "again")
    connect_properties = PahoProperties(PacketTypes.CONNECT)
    connect_properties.SessionExpiryInterval = 3600
    flags, _, _ = second.connect(properties=connect_properties)
    assert flags.session_present is False
    second.subscribe("marker")
    second.publish("before", b"stale")
    second.publish("marker")
    assert_next_is_marker(second, "marker")


# ---- disconnects and wills --------------------------------------------------------------------


def _client_with_will(paho_factory: PahoFactory, port: int, client_id: str) -> PahoClient:
    client = paho_factory(port, client_id)
    client.client.will_set(
        "wills/" + client_id,
        b"gone",
        qos=1,
        properties=publish_properties(
            ContentType="text/plain",
            CorrelationData=b"\x00\x01",
            ResponseTopic="wills/replies",
            UserProperty=[("k", "1"), ("k", "2")],
        ),
    )
    assert client.connect()[1] == 0
    return client


def test_clean_disconnect_discards_the_will(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    observer = connected(paho_factory, mqtt_broker.port, "observer")
    observer.subscribe("wills/#")
    observer.subscribe("marker")
    leaver = _client_with_will(paho_factory, mqtt_broker.port, "polite")
    leaver.close()

    assert mqtt_broker.disconnects.wait_for(lambda e: e[0] == "polite") == (
        "polite",
        DisconnectReason.CLEAN,
    )
    observer.publish("marker")
    assert_next_is_marker(observer, "marker")


def test_dropped_socket_publishes_the_will(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    observer = connected(paho_factory, mqtt_broker.port, "observer")
    observer.subscribe("wills/#")
    dropper = _client_with_will(paho_factory, mqtt_broker.port, "rude")
    sock = dropper.client.socket()
    assert isinstance(sock, socket.socket)
    sock.shutdown(socket.SHUT_RDWR)  # the network goes away; no DISCONNECT packet

    will = observer.next_message()
    assert (will.topic, will.payload, will.qos) == ("wills/rude", b"gone", 1)
    assert will.properties.ContentType == "text/plain"
    assert will.properties.CorrelationData == b"\x00\x01"
    assert will.properties.ResponseTopic == "wills/replies"
    assert will.properties.UserProperty == [("k", "1"), ("k", "2")]
    assert mqtt_broker.disconnects.wait_for(lambda e: e[0] == "rude") == (
        "rude",
        DisconnectReason.DROPPED,
    )


def test_disconnect_with_will_message_reason_keeps_the_will(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory, raw_factory: RawFactory
) -> None:
    observer = connected(paho_factory, mqtt_broker.port, "observer")
    observer.subscribe("wills/#")
    raw = raw_factory(mqtt_broker.port)
    raw.connect("leaves-will", will=mp.Will("wills/leaves-will", b"bye"))
    raw.send(mp.Disconnect(mp.ReasonCode.DISCONNECT_WITH_WILL_MESSAGE))
    assert observer.next_message().payload == b"bye"


# ---- the service hooks ------------------------------------------------------------------------


def test_intercept_sees_sender_and_all_properties_before_the_puback(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    intercepted: EventLog[tuple[str, Message]] = EventLog()
    mqtt_broker.call(mqtt_broker.broker.intercept, "svc/+/req", lambda *e: intercepted.append(e))
    subscriber = connected(paho_factory, mqtt_broker.port, "listener")
    subscriber.subscribe("svc/#")
    requester = connected(paho_factory, mqtt_broker.port, "requester")

    requester.publish(
        "svc/store/req",
        b"*1\r\n$4\r\nPING\r\n",
        properties=publish_properties(
            ResponseTopic="clients/requester/resp",
            CorrelationData=b"\xde\xad",
            ContentType="application/resp3",
            PayloadFormatIndicator=1,
            MessageExpiryInterval=30,
            UserProperty=[("__ts", "1"), ("x", "y"), ("__ts", "2")],
        ),
    )
    # publish() returned after the PUBACK; the handler must already have run.
    assert intercepted.items == [
        (
            "requester",
            Message(
                topic="svc/store/req",
                payload=b"*1\r\n$4\r\nPING\r\n",
                qos=1,
                retain=False,
                response_topic="clients/requester/resp",
                correlation_data=b"\xde\xad",
                content_type="application/resp3",
                message_expiry_interval=30,
                payload_format_indicator=1,
                user_properties=[("__ts", "1"), ("x", "y"), ("__ts", "2")],
            ),
        )
    ]
    assert subscriber.next_message().topic == "svc/store/req"  # routed as usual too


def test_disconnect_client(mqtt_broker: BrokerThread, paho_factory: PahoFactory) -> None:
    victim = connected(paho_factory, mqtt_broker.port, "victim")
    bystander = connected(paho_factory, mqtt_broker.port, "bystander")
    mqtt_broker.call(mqtt_broker.broker.disconnect_client, "victim", 0x98)

    assert victim.disconnects.wait_for(lambda _: True).value == 0x98
    assert mqtt_broker.disconnects.wait_for(lambda e: e[0] == "victim") == (
        "victim",
        DisconnectReason.KICKED,
    )
    assert mqtt_broker.call(mqtt_broker.broker.connected_clients) == {"bystander"}
    mqtt_broker.call(mqtt_broker.broker.disconnect_client, "nobody")  # no-op
    assert bystander.client.is_connected()


# ---- robustness -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("garbage", "reason_code"),
    [
        (b"\x00\x00", mp.ReasonCode.MALFORMED_PACKET),  # reserved packet type 0
        (b"\xc1\x00", mp.ReasonCode.MALFORMED_PACKET),  # PINGREQ with flags
        (b"\x30\xff\xff\xff\xff\x01", mp.ReasonCode.MALFORMED_PACKET),  # 5-byte length
        (b"\x30\x80\x80\x80\x08", mp.ReasonCode.PACKET_TOO_LARGE),  # 16 MiB + body
        (b"\x30\x06\x00\x03a\xffb\x00", mp.ReasonCode.MALFORMED_PACKET),  # bad UTF-8
        (mp.encode(mp.Publish("q2", b"", 2, packet_id=1)), mp.ReasonCode.QOS_NOT_SUPPORTED),
        (mp.encode(mp.Publish("a/+", b"")), mp.ReasonCode.TOPIC_NAME_INVALID),
        (
            mp.encode(mp.Publish("a", b"", properties=mp.Properties(topic_alias=1))),
            mp.ReasonCode.TOPIC_ALIAS_INVALID,
        ),
        (mp.encode(mp.Connect("second")), mp.ReasonCode.PROTOCOL_ERROR),
        (mp.encode(mp.Auth()), mp.ReasonCode.PROTOCOL_ERROR),
        (mp.encode(mp.Suback(1, [0])), mp.ReasonCode.PROTOCOL_ERROR),
        (mp.encode(mp.Pubrel(1)), mp.ReasonCode.PROTOCOL_ERROR),
    ],
)
def test_bad_packets_after_connect_get_a_disconnect_reason(
    mqtt_broker: BrokerThread,
    paho_factory: PahoFactory,
    raw_factory: RawFactory,
    garbage: bytes,
    reason_code: int,
) -> None:
    raw = raw_factory(mqtt_broker.port)
    raw.connect("bad")
    raw.send_bytes(garbage)
    assert raw.expect(mp.Disconnect).reason_code == reason_code
    raw.expect_closed()
    assert mqtt_broker.disconnects.wait_for(lambda e: e[0] == "bad") == (
        "bad",
        DisconnectReason.PROTOCOL_ERROR,
    )
    assert_broker_serves(paho_factory, mqtt_broker.port)


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\xff" * 64,
        mp.encode(mp.Pingreq()),  # a valid packet, but not CONNECT
        b"\x10\x03\x00\x01M",  # truncated CONNECT
    ],
)
def test_garbage_before_connect_just_closes(
    mqtt_broker: BrokerThread,
    paho_factory: PahoFactory,
    raw_factory: RawFactory,
    garbage: bytes,
) -> None:
    raw = raw_factory(mqtt_broker.port)
    raw.send_bytes(garbage)
    leftover = raw.receive_raw_until_closed()
    # At most a CONNACK refusing a broken CONNECT; never a crash.
    assert leftover in (b"", mp.encode(mp.Connack(mp.ReasonCode.MALFORMED_PACKET)))
    assert_broker_serves(paho_factory, mqtt_broker.port)
    assert mqtt_broker.disconnects.items == []  # it never was a client


def test_failing_handlers_do_not_break_the_broker(
    mqtt_broker: BrokerThread, paho_factory: PahoFactory
) -> None:
    def explode(client_id: str, _: object) -> None:
        if client_id == "survivor":
            raise RuntimeError("handler bug")

    mqtt_broker.call(mqtt_broker.broker.intercept, "#", explode)
    mqtt_broker.call(mqtt_broker.broker.on_disconnect, explode)
    client = connected(paho_factory, mqtt_broker.port, "survivor")
    client.subscribe("t")
    client.publish("t", b"still routed")
    assert client.next_message().payload == b"still routed"
    client.close()
    mqtt_broker.disconnects.wait_for(lambda e: e[0] == "survivor")
    assert_broker_serves(paho_factory, mqtt_broker.port)
    assert any("handler bug" in str(r.exc_info) for r in mqtt_broker.logged_errors)
    mqtt_broker.logged_errors.clear()


# ---- the asyncio API --------------------------------------------------------------------------


async def test_async_context_manager_and_shutdown_reason() -> None:
    disconnects: list[tuple[str, DisconnectReason]] = []
    async with Broker(port=0) as broker:
        broker.on_disconnect(lambda *event: disconnects.append(event))
        assert broker.port != 0
        assert broker.url == f"mqtt://127.0.0.1:{broker.port}"
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
        writer.write(mp.encode(mp.Connect("async-client")))
        packets = mp.PacketReader()
        while (connack := packets.next_packet()) is None:
            packets.feed(await asyncio.wait_for(reader.read(1024), TIMEOUT))
        assert isinstance(connack, mp.Connack) and connack.reason_code == 0
        assert broker.connected_clients() == {"async-client"}
    # Leaving the block stopped the broker: the client got DISCONNECT 0x8B and EOF.
    while (disconnect := packets.next_packet()) is None:
        data = await asyncio.wait_for(reader.read(1024), TIMEOUT)
        assert data, "closed without DISCONNECT"
        packets.feed(data)
    assert disconnect == mp.Disconnect(mp.ReasonCode.SERVER_SHUTTING_DOWN)
    assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
    writer.close()
    await writer.wait_closed()
    assert disconnects == [("async-client", DisconnectReason.SERVER_SHUTDOWN)]
