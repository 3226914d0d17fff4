"""Abusive clients: the broker bounds what each may cost and keeps serving the others.

Each test checks, besides the bound, that a well-behaved client is served meanwhile.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from agent.emulator import mqtt_packets as mp
from agent.emulator.broker import DisconnectReason, Message
from tests.emulator.conftest import TIMEOUT, BrokerThread, EventLog, PahoClient, RawClient
from tests.emulator.test_broker import assert_broker_serves, connected

PahoFactory = Callable[..., PahoClient]
RawFactory = Callable[[int], RawClient]
BrokerFactory = Callable[..., BrokerThread]

KIB = 1024


def silent_subscriber(port: int, client_id: str, topic: str, qos: int) -> socket.socket:
    """A client that subscribes, then never reads again (a small receive buffer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(TIMEOUT)
    sock.connect(("127.0.0.1", port))
    reader = mp.PacketReader()

    def expect(packet_type: type[mp.Packet]) -> None:
        while (packet := reader.next_packet()) is None:
            reader.feed(sock.recv(65536))
        assert isinstance(packet, packet_type), packet

    sock.sendall(mp.encode(mp.Connect(client_id)))
    expect(mp.Connack)
    sock.sendall(mp.encode(mp.Subscribe(1, [mp.Subscription(topic, qos)])))
    expect(mp.Suback)
    return sock


def flood(client: PahoClient, topic: str, count: int, size: int, qos: int = 0) -> None:
    """Publishes ``count`` messages and waits until the broker has taken them all."""
    payload = b"x" * size
    for _ in range(count - 1):
        client.client.publish(topic, payload, qos=qos)
    last = client.client.publish(topic, payload, qos=1)
    last.wait_for_publish(30)
    assert last.is_published()


def test_a_subscriber_that_reads_nothing_has_its_qos0_messages_dropped(
    broker_factory: BrokerFactory, paho_factory: PahoFactory
) -> None:
    """Was: 20,000 messages of 1 KiB all queued for that client (16.8 MB of write buffer)."""
    broker = broker_factory(max_queued_bytes=256 * KIB)
    sock = silent_subscriber(broker.port, "sleeper", "flood", qos=0)
    try:
        watcher = connected(paho_factory, broker.port, "watcher")
        watcher.subscribe("flood", qos=0)
        publisher = connected(paho_factory, broker.port, "publisher")
        flood(publisher, "flood", 20_000, KIB)
        queued = broker.call(broker.broker.queued_bytes, "sleeper")
        # The bound, plus at most one message over it, plus what the kernel would not take.
        assert queued is not None and queued <= 256 * KIB + 2 * KIB, queued
        assert broker.call(broker.broker.connected_clients) >= {"sleeper", "watcher"}
        assert_broker_serves(paho_factory, broker.port)
    finally:
        sock.close()


def test_a_subscriber_that_reads_nothing_at_qos1_is_disconnected(
    broker_factory: BrokerFactory, paho_factory: PahoFactory
) -> None:
    broker = broker_factory(max_queued_bytes=256 * KIB)
    sock = silent_subscriber(broker.port, "sleeper", "flood", qos=1)
    try:
        publisher = connected(paho_factory, broker.port, "publisher")
        flood(publisher, "flood", 8_000, KIB, qos=1)
        event = broker.disconnects.wait_for(lambda e: e[0] == "sleeper")
        assert event == ("sleeper", DisconnectReason.SLOW_CONSUMER)
        assert broker.call(broker.broker.queued_bytes, "sleeper") is None
        assert_broker_serves(paho_factory, broker.port)
    finally:
        sock.close()


def test_a_subscriber_that_never_acknowledges_is_disconnected(
    broker_factory: BrokerFactory, paho_factory: PahoFactory, raw_factory: RawFactory
) -> None:
    """It reads, but sends no PUBACK: its window fills and the rest waits, up to the bound."""
    broker = broker_factory(max_queued_bytes=64 * KIB)
    raw = raw_factory(broker.port)
    raw.connect("no-acks", properties=mp.Properties(receive_maximum=1))
    raw.send(mp.Subscribe(1, [mp.Subscription("flood", 1)]))
    raw.expect(mp.Suback)
    publisher = connected(paho_factory, broker.port, "publisher")
    flood(publisher, "flood", 200, KIB, qos=1)
    first = raw.expect(mp.Publish)
    assert first.qos == 1
    assert raw.expect(mp.Disconnect).reason_code == mp.ReasonCode.QUOTA_EXCEEDED
    assert broker.disconnects.wait_for(lambda e: e[0] == "no-acks")[1] is (
        DisconnectReason.SLOW_CONSUMER
    )
    assert_broker_serves(paho_factory, broker.port)


def test_maximum_packet_size_is_advertised_and_enforced(
    broker_factory: BrokerFactory, paho_factory: PahoFactory, raw_factory: RawFactory
) -> None:
    broker = broker_factory(max_packet_size=1000)
    raw = raw_factory(broker.port)
    connack = raw.connect("big")
    assert connack.properties.maximum_packet_size == 1000
    fits = mp.Publish("t", b"", 1, packet_id=1)
    fits.payload = b"x" * (1000 - len(mp.encode(fits)) - 1)  # the length takes 2 bytes then
    assert len(mp.encode(fits)) == 1000
    raw.send(fits)
    assert raw.expect(mp.Puback).reason_code == 0
    over = mp.Publish("t", fits.payload + b"x", 1, packet_id=2)
    raw.send(over)
    assert raw.expect(mp.Disconnect).reason_code == mp.ReasonCode.PACKET_TOO_LARGE
    raw.expect_closed()
    # A CONNECT over the limit is refused with a CONNACK saying so.
    raw2 = raw_factory(broker.port)
    raw2.send(mp.Connect("huge", properties=mp.Properties(user_properties=[("k", "v" * 1000)])))
    assert raw2.expect(mp.Connack).reason_code == mp.ReasonCode.PACKET_TOO_LARGE
    raw2.expect_closed()
    assert_broker_serves(paho_factory, broker.port)


def _opened(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)


def _is_closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_connections_beyond_the_maximum_are_closed_at_once(
    broker_factory: BrokerFactory, paho_factory: PahoFactory, raw_factory: RawFactory
) -> None:
    broker = broker_factory(max_connections=3)
    held = [raw_factory(broker.port) for _ in range(3)]
    held[0].connect("one")
    extra = _opened(broker.port)
    try:
        assert _is_closed_by_peer(extra)
    finally:
        extra.close()
    held[1].close()
    held[2].close()
    assert_broker_serves(paho_factory, broker.port)  # room again


def test_connections_beyond_the_rate_are_closed_at_once(
    broker_factory: BrokerFactory, paho_factory: PahoFactory
) -> None:
    broker = broker_factory(max_connection_rate=5)
    socks = [_opened(broker.port) for _ in range(30)]
    try:
        for sock in socks:
            sock.sendall(mp.encode(mp.Connect("")))
        closed = sum(_is_closed_by_peer_or_connack(sock) for sock in socks)
        assert 30 - 5 - 3 <= closed < 30  # a burst of 5, and a few tokens earned meanwhile
    finally:
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + TIMEOUT
    while True:  # the bucket refills at 5 per second; a refused socket is closed at once
        sock = _opened(broker.port)
        try:
            sock.sendall(mp.encode(mp.Connect("")))
            if not _is_closed_by_peer_or_connack(sock):
                break
        finally:
            sock.close()
        assert time.monotonic() < deadline, "the bucket did not refill"


def _is_closed_by_peer_or_connack(sock: socket.socket) -> bool:
    """True when the broker closed the socket, False when it answered the CONNECT."""
    try:
        data = sock.recv(65536)
    except ConnectionResetError:
        return True
    return data == b""


def test_a_client_that_never_finishes_connect_is_closed(
    broker_factory: BrokerFactory, paho_factory: PahoFactory, raw_factory: RawFactory
) -> None:
    broker = broker_factory(connect_timeout_s=0.3)
    silent = raw_factory(broker.port)
    partial = raw_factory(broker.port)
    partial.send_bytes(mp.encode(mp.Connect("slow"))[:5])
    started = time.monotonic()
    silent.expect_closed(timeout=TIMEOUT)
    partial.expect_closed(timeout=TIMEOUT)
    assert time.monotonic() - started < TIMEOUT
    assert broker.disconnects.items == []
    assert_broker_serves(paho_factory, broker.port)


def test_a_request_flood_does_not_starve_another_client(
    broker_factory: BrokerFactory, raw_factory: RawFactory
) -> None:
    """A flooder's backlog is served in turns: another client's message is handled early.

    Served a whole read (256 KiB) at a time, the other client's message came after some
    5,000 of the flooder's; in turns of 16 packets, after a few hundred.
    """
    broker = broker_factory()
    handled: EventLog[str] = EventLog()
    count = [0]
    under_way = threading.Event()

    def on_message(sender: str, message: Message) -> None:
        if sender == "flooder":
            count[0] += 1
            if count[0] == 200:
                under_way.set()
        else:
            handled.append(f"{sender} after {count[0]}")

    broker.call(broker.broker.intercept, "#", on_message)
    flooder = raw_factory(broker.port)
    flooder.connect("flooder")
    other = raw_factory(broker.port)
    other.connect("other")
    total = 40_000
    batch = b"".join(
        mp.encode(mp.Publish("flood", b"x" * 16, 1, packet_id=i % 65535 + 1)) for i in range(total)
    )
    sender = threading.Thread(target=flooder.send_bytes, args=(batch,))
    sender.start()
    try:
        assert under_way.wait(TIMEOUT)
        # Counted from the send, not from the 200th: on a busy machine this thread may wake
        # thousands of the flooder's messages after the event was set.
        sent_after = count[0]
        other.send(mp.Publish("ping", b"", 1, packet_id=1))
        assert other.expect(mp.Puback).packet_id == 1
        line = handled.wait_for(lambda _: True)
        after = int(line.split()[-1])
        assert after - sent_after < 2_000, f"{line}, sent after {sent_after}"
    finally:
        sender.join(TIMEOUT * 5)


MIB = 1024 * KIB


def _connect_of(size: int, client_id: str) -> bytes:
    """The bytes of a CONNECT of exactly ``size`` bytes (padded with a user property)."""
    pad = size
    while len(data := mp.encode(mp.Connect(client_id, properties=_padded(pad)))) != size:
        pad -= len(data) - size  # the lengths' own sizes change with it
    return data


def _padded(count: int) -> mp.Properties:
    return mp.Properties(user_properties=[("pad", "x" * count)])


def test_a_client_that_has_not_authenticated_may_not_announce_a_big_connect(
    broker_factory: BrokerFactory, paho_factory: PahoFactory, raw_factory: RawFactory
) -> None:
    """Was: 24 sockets each announcing a 16 MiB CONNECT and sending 15 MiB of it took the
    broker from 61 to 437 MiB, with no credentials; each waited for the rest of its CONNECT."""
    broker = broker_factory()  # the default limits
    raw = raw_factory(broker.port)
    raw.send_bytes(b"\x10" + mp.encode_varint(16 * MIB - 5))
    assert raw.expect(mp.Connack).reason_code == mp.ReasonCode.PACKET_TOO_LARGE
    raw.expect_closed()
    # Once connected, the client's packets may be as big as the maximum packet size.
    big = raw_factory(broker.port)
    big.connect("big")
    big.send(mp.Publish("t", b"x" * (256 * KIB), 1, packet_id=1))
    assert big.expect(mp.Puback).reason_code == 0
    assert_broker_serves(paho_factory, broker.port)


def test_all_clients_that_have_not_authenticated_together_hold_a_bounded_amount(
    broker_factory: BrokerFactory, paho_factory: PahoFactory, raw_factory: RawFactory
) -> None:
    broker = broker_factory(max_connect_size=4 * KIB, max_unauthenticated_bytes=10 * KIB)
    connects = [_connect_of(3500, f"holder-{i}") for i in range(5)]
    holders = [raw_factory(broker.port) for _ in range(4)]
    for holder, data in zip(holders, connects, strict=False):
        holder.send_bytes(data[:3000])
    # Three hold 9000 bytes; the fourth would take them past 10 KiB: it is told so.
    assert holders[3].expect(mp.Connack).reason_code == mp.ReasonCode.SERVER_BUSY
    holders[3].expect_closed()
    assert_broker_serves(paho_factory, broker.port)  # a small CONNECT still fits
    holders[0].close()  # what it held is free again
    fifth = raw_factory(broker.port)
    fifth.send_bytes(connects[4][:3000])
    completing = [(holders[1], connects[1]), (holders[2], connects[2]), (fifth, connects[4])]
    for holder, data in completing:
        holder.send_bytes(data[3000:])
        assert holder.expect(mp.Connack).reason_code == 0
