"""Abusive store clients: registrations and notifications cost what the quota allows.

The emulator runs in this process (its loop on a thread of its own) so that what it
allocates can be traced; clients are real sockets.
"""

from __future__ import annotations

import socket
import time
import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from agent.emulator import mqtt_packets as mp
from agent.emulator.limits import StoreLimits
from agent.emulator.store import (
    KEY_TOO_LONG,
    REGISTRATIONS_TOO_LARGE,
    TOO_MANY_REGISTRATIONS,
    StateStore,
)
from agent.protocol import errors, topics
from agent.protocol.resp3 import encode_request
from tests.emulator.conftest import TIMEOUT, EmulatorThread
from tests.support.paho_client import PahoStoreClient, now_ts

EmulatorFactory = Callable[..., EmulatorThread]
OK = b"+OK\r\n"
QUOTA_EXCEEDED = f"-ERR {errors.QUOTA_EXCEEDED}\r\n".encode()
MIB = 1 << 20


@pytest.fixture
def store_clients() -> Iterator[Callable[..., PahoStoreClient]]:
    made: list[PahoStoreClient] = []

    def make(port: int, client_id: str) -> PahoStoreClient:
        client = PahoStoreClient("127.0.0.1", port, client_id)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def test_registrations_count_against_the_quota(
    emulator_factory: EmulatorFactory, store_clients: Callable[..., PahoStoreClient]
) -> None:
    """Was: 10,000 registrations from one client all accepted, and 40 on 4 MiB key names
    added 178 MiB, even under --quota 1. The quota bounds the key names the store holds:
    its keys and the names registered for notification."""
    server = emulator_factory(quota=2)
    first, second = store_clients(server.port, "first"), store_clients(server.port, "second")
    assert first.request("KEYNOTIFY", "a").payload == OK
    assert first.request("SET", "b", "v").payload == OK
    assert first.request("KEYNOTIFY", "c").payload == QUOTA_EXCEEDED
    assert second.request("KEYNOTIFY", "c" * 1000).payload == QUOTA_EXCEEDED
    assert first.request("SET", "c", "v").payload == QUOTA_EXCEEDED
    # What the store holds already costs nothing more: a key registered, a registration set.
    assert second.request("KEYNOTIFY", "a").payload == OK
    assert second.request("KEYNOTIFY", "b").payload == OK
    assert first.request("SET", "a", "v").payload == OK
    assert first.request("KEYNOTIFY", "a").payload == OK  # again: idempotent
    # A name nobody registers any more, and that is no key, is free again.
    assert first.request("KEYNOTIFY", "a", "STOP").payload == OK
    assert first.request("DEL", "a").payload == b":1\r\n"
    assert first.request("KEYNOTIFY", "c").payload == QUOTA_EXCEEDED  # second still has a
    assert second.request("KEYNOTIFY", "a", "STOP").payload == OK
    assert first.request("KEYNOTIFY", "c").payload == OK


def refusal(text: str) -> bytes:
    return f"-ERR {text}\r\n".encode()


def test_registrations_are_bounded_per_client_by_default() -> None:
    """Was: without --quota, 10,000 registrations from one client were all accepted."""
    store = StateStore(lambda: time.time_ns() // 1_000_000, lambda: 0)
    now = now_ts()

    def keynotify(client: str, key: bytes) -> bytes:
        return store.handle(client, encode_request([b"KEYNOTIFY", key]), now).reply.payload

    limits = StoreLimits()
    for index in range(limits.max_registrations):
        assert keynotify("many", b"key-%d" % index) == OK
    assert keynotify("many", b"one-more") == refusal(TOO_MANY_REGISTRATIONS)
    assert keynotify("other", b"one-more") == OK  # per client
    for index in range(limits.max_registration_bytes // limits.max_key_size):
        assert keynotify("big", b"n" * (limits.max_key_size - 2) + b"%02d" % index) == OK
    assert keynotify("big", b"x" * 100) == refusal(REGISTRATIONS_TOO_LARGE)


def test_registration_bounds_over_mqtt(
    emulator_factory: EmulatorFactory, store_clients: Callable[..., PahoStoreClient]
) -> None:
    """Was: 40 registrations on 4 MiB key names added 172 MiB, no key ever set."""
    server = emulator_factory(
        store_limits=StoreLimits(max_registrations=3, max_registration_bytes=2000)
    )
    first, second = store_clients(server.port, "first"), store_clients(server.port, "second")
    assert second.request("KEYNOTIFY", "c" * (4 * MIB)).payload == refusal(KEY_TOO_LONG)
    assert second.request("SET", "c" * (4 * MIB), "v").payload == refusal(KEY_TOO_LONG)
    for name in ("a", "b", "c"):
        assert first.request("KEYNOTIFY", name).payload == OK
    assert first.request("KEYNOTIFY", "a").payload == OK  # again: no new registration
    assert first.request("KEYNOTIFY", "d").payload == refusal(TOO_MANY_REGISTRATIONS)
    assert second.request("KEYNOTIFY", "d").payload == OK  # the bound is per client
    assert first.request("KEYNOTIFY", "a", "STOP").payload == OK
    assert first.request("KEYNOTIFY", "d").payload == OK  # a STOP makes room
    assert second.request("KEYNOTIFY", "e" * 1500).payload == OK
    assert second.request("KEYNOTIFY", "f" * 500).payload == refusal(REGISTRATIONS_TOO_LARGE)
    second.close()  # a client gone frees what it held
    third = store_clients(server.port, "second")
    assert third.request("KEYNOTIFY", "f" * 1999).payload == OK


def _silent_watcher(port: int, client_id: str, key: bytes) -> socket.socket:
    """A client that registers for ``key``, then reads nothing (a small receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(TIMEOUT)
    sock.connect(("127.0.0.1", port))
    reader = mp.PacketReader()

    def expect(packet_type: type[mp.Packet]) -> mp.Packet:
        while (packet := reader.next_packet()) is None:
            reader.feed(sock.recv(65536))
        assert isinstance(packet, packet_type), packet
        return packet

    response_topic = topics.response_topic(client_id)
    sock.sendall(mp.encode(mp.Connect(client_id)))
    expect(mp.Connack)
    subscriptions = [
        mp.Subscription(response_topic, 1),
        mp.Subscription(topics.notify_filter(client_id), 1),
    ]
    sock.sendall(mp.encode(mp.Subscribe(1, subscriptions)))
    expect(mp.Suback)
    request = mp.Publish(
        topics.INVOKE_TOPIC,
        encode_request([b"KEYNOTIFY", key]),
        1,
        packet_id=2,
        properties=mp.Properties(
            response_topic=response_topic,
            correlation_data=b"c" * 16,
            user_properties=[(topics.TIMESTAMP, now_ts())],
        ),
    )
    sock.sendall(mp.encode(request))
    answer = expect(mp.Publish)
    assert isinstance(answer, mp.Publish) and answer.payload == OK
    return sock


def test_one_notification_is_shared_by_its_watchers(
    emulator_factory: EmulatorFactory, store_clients: Callable[..., PahoStoreClient]
) -> None:
    """Was: one 15 MiB SET watched by 20 clients that read nothing added 187 MiB: every
    connection encoded its own copy of the notification, held until its client read it."""
    server = emulator_factory()
    watchers = [_silent_watcher(server.port, f"watcher-{i}", b"big") for i in range(20)]
    writer = store_clients(server.port, "writer")
    value = b"v" * (8 * MIB)  # past what the kernel takes into a socket (4 MiB here)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert writer.request("SET", "big", value).payload == OK
        assert writer.request("GET", "small").payload == b"$-1\r\n"  # the SET is behind it
        deadline = time.monotonic() + TIMEOUT
        while True:  # every watcher has its notification, or what its socket did not take
            queued = [
                server.call(server.emulator.broker.queued_bytes, f"watcher-{i}") for i in range(20)
            ]
            if all(q is not None and q > MIB for q in queued):
                break
            assert time.monotonic() < deadline, queued
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        for sock in watchers:
            sock.close()
    # The value kept, the notification shared, the request on its way: not 20 copies.
    assert grown < 5 * len(value), f"{grown / MIB:.1f} MiB for a {len(value) // MIB} MiB value"
