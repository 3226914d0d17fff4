"""The state store over real MQTT 5, byte for byte against protocol.md, with paho-mqtt.

Every test runs twice: against `agent emulator` (our embedded broker) and against
`agent emulator --external` serving on Debian's mosquitto.
"""

from __future__ import annotations

import itertools
import os
import queue
import time
from collections.abc import Callable, Iterator

import pytest

from agent.protocol import errors, topics
from agent.protocol.hlc import Hlc
from tests.support.mosquitto import Mosquitto, mosquitto_binary
from tests.support.paho_client import TIMEOUT, PahoStoreClient, Received, now_ts
from tests.support.processes import READY_URL, AgentProcess

OK = b"+OK\r\n"
QUOTA = 1000
_ids = itertools.count()


class Backend:
    def __init__(self, kind: str, *extra: str) -> None:
        self.kind = kind
        self.mosquitto: Mosquitto | None = None
        args = ["emulator", "--quota", str(QUOTA), "--deny-prefix", "secret/", *extra]
        if kind == "embedded":
            args += ["--port", "0"]
        else:
            self.mosquitto = Mosquitto()
            self.mosquitto.start()
            args += ["--external", self.mosquitto.url]
        self.process = AgentProcess(args)
        match = self.process.wait_for(READY_URL)
        self.host, self.port = match.group(1), int(match.group(2))
        self.clients: list[PahoStoreClient] = []

    def client(self, name: str = "c", **kwargs: object) -> PahoStoreClient:
        client = PahoStoreClient(self.host, self.port, f"{name}-{next(_ids)}", **kwargs)  # type: ignore[arg-type]
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        assert self.process.stop() == 0
        if self.mosquitto is not None:
            self.mosquitto.stop()


def _kinds() -> list[str]:
    kinds = ["embedded"]
    if mosquitto_binary() is not None or os.environ.get("CI"):
        kinds.append("mosquitto")
    return kinds


@pytest.fixture(scope="module", params=_kinds())
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    server = Backend(request.param)
    yield server
    server.close()


@pytest.fixture
def key() -> bytes:
    return f"key-{next(_ids)}".encode()


def err(text: str) -> bytes:
    return b"-ERR " + text.encode() + b"\r\n"


def ts_of(received: Received) -> Hlc:
    value = received.prop(topics.TIMESTAMP)
    assert value is not None, received
    return Hlc.parse(value)


def assert_response_properties(received: Received) -> None:
    assert received.prop(topics.STATUS) == "200"
    assert received.prop(topics.PROTOCOL_VERSION_PROPERTY) == "1.0"
    assert received.qos == 1


def assert_nothing(waiter: queue.Queue[Received], then: Callable[[], object]) -> None:
    """`then()` is answered, and by then nothing came for `waiter`."""
    then()
    assert waiter.empty()


# ------------------------------------------------------------------ requests and responses


def test_set_get_exact_bytes(backend: Backend, key: bytes) -> None:
    client = backend.client()
    request_ts = now_ts(client.client_id)
    correlation = os.urandom(16)
    response = client.request("SET", key, "value", ts=request_ts, correlation=correlation)
    assert response.payload == OK
    assert response.correlation_data == correlation
    assert response.topic == client.response_topic
    assert_response_properties(response)
    version = ts_of(response)
    assert version > Hlc.parse(request_ts)

    got = client.request("GET", key)
    assert got.payload == b"$5\r\nvalue\r\n"
    assert ts_of(got) == version
    assert_response_properties(got)

    missing = client.request("GET", key + b"-missing")
    assert missing.payload == b"$-1\r\n"
    assert missing.prop(topics.TIMESTAMP) is None
    assert_response_properties(missing)


@pytest.mark.parametrize("length", [1, 16, 300])
def test_correlation_data_echoed_whatever_its_length(backend: Backend, length: int) -> None:
    correlation = os.urandom(length)
    response = backend.client().request("GET", "x", correlation=correlation)
    assert response.correlation_data == correlation


def test_binary_values_and_lower_case_verbs(backend: Backend, key: bytes) -> None:
    client = backend.client()
    value = bytes(range(256)) + b"\r\n"
    assert client.request("set", key, value, "px", "60000").payload == OK
    assert client.request("get", key).payload == b"$258\r\n" + value + b"\r\n"
    assert client.request("vdel", key, value).payload == b":1\r\n"


def test_conditions_and_deletes(backend: Backend, key: bytes) -> None:
    client = backend.client()
    first = client.request("SET", key, "a", "NX")
    assert first.payload == OK
    refused = client.request("SET", key, "b", "NX")
    assert refused.payload == b":-1\r\n"
    assert ts_of(refused) == ts_of(first)
    assert client.request("SET", key, "b", "NEX").payload == b":-1\r\n"
    assert client.request("SET", key, "a", "NEX", "PX", "60000").payload == OK
    assert client.request("VDEL", key, "b").payload == b":-1\r\n"
    deleted = client.request("DEL", key)
    assert deleted.payload == b":1\r\n"
    ts_of(deleted)
    assert client.request("DEL", key).payload == b":0\r\n"
    assert client.request("VDEL", key, "a").payload == b":0\r\n"


def test_lock_renewals_increase_and_fence(backend: Backend, key: bytes) -> None:
    a, b = backend.client("a"), backend.client("b")
    lock = key + b"\\lock"
    first = a.request("SET", lock, "a", "NEX", "PX", "60000")
    renewed = a.request("SET", lock, "a", "NEX", "PX", "60000")
    assert first.payload == renewed.payload == OK
    assert ts_of(renewed) > ts_of(first)
    assert b.request("SET", lock, "b", "NEX", "PX", "60000").payload == b":-1\r\n"
    assert a.request("GET", lock).payload == b"$1\r\na\r\n"

    old, new = str(ts_of(first)), str(ts_of(renewed))
    assert a.request("SET", key, "1", ft=old).payload == OK
    assert a.request("SET", key, "2", ft=new).payload == OK
    assert b.request("SET", key, "3", ft=old).payload == err(errors.FENCING_TOKEN_LOWER_VERSION)
    assert b.request("SET", key, "3").payload == err(errors.FENCING_TOKEN_REQUIRED)
    assert b.request("DEL", key).payload == err(errors.FENCING_TOKEN_REQUIRED)
    assert b.request("VDEL", key, "2", ft=old).payload == err(errors.FENCING_TOKEN_LOWER_VERSION)
    assert a.request("GET", key).payload == b"$1\r\n2\r\n"
    assert a.request("VDEL", lock, "a").payload == b":1\r\n"


def _future_ts(ms: int) -> str:
    return now_ts("far", ms)


@pytest.mark.parametrize(
    ("args", "options", "text"),
    [
        (["SET", "k", "v", "PX", "0"], {}, errors.SYNTAX_ERROR),
        (["SET", "k", "v", "PX", "1.5"], {}, errors.SYNTAX_ERROR),
        (["SET", "k", "v", "PX", "9" * 4301], {}, errors.SYNTAX_ERROR),
        (["SET", "k", "v", "NX", "NEX"], {}, errors.SYNTAX_ERROR),
        (["SET", "k", "v", "BOGUS"], {}, errors.SYNTAX_ERROR),
        (["KEYNOTIFY", "k", "GO"], {}, errors.SYNTAX_ERROR),
        (["HGET", "k"], {}, errors.UNKNOWN_COMMAND),
        (["GET"], {}, errors.WRONG_NUMBER_OF_ARGUMENTS),
        (["SET", "k"], {}, errors.WRONG_NUMBER_OF_ARGUMENTS),
        (["GET", ""], {}, errors.KEY_LENGTH_ZERO),
        (["SET", "k", "v"], {"ts": None}, errors.MISSING_TIMESTAMP),
        (["SET", "k", "v"], {"ts": "12:34"}, errors.MALFORMED_TIMESTAMP),
        (["SET", "k", "v"], {"ft": "nonsense"}, errors.MALFORMED_TIMESTAMP),
        (["SET", "k", "v"], {"ts": "future"}, errors.TIMESTAMP_SKEW),
        (["SET", "k", "v"], {"ft": "future"}, errors.FENCING_TOKEN_SKEW),
        (["GET", "secret/k"], {}, errors.NOT_AUTHORIZED),
    ],
)
def test_error_texts(
    backend: Backend, args: list[str], options: dict[str, str | None], text: str
) -> None:
    resolved = {k: (_future_ts(120_000) if v == "future" else v) for k, v in options.items()}
    response = backend.client().request(*args, **resolved)
    assert response.payload == err(text)
    assert_response_properties(response)


def test_malformed_payload_is_a_syntax_error(backend: Backend) -> None:
    response = backend.client().request(payload=b"*2\r\n$3\r\nGET")
    assert response.payload == err(errors.SYNTAX_ERROR)


def test_quota() -> None:
    server = Backend("embedded", "--quota", "2")
    try:
        client = server.client()
        assert client.request("SET", "q1", "v").payload == OK
        assert client.request("SET", "q2", "v").payload == OK
        assert client.request("SET", "q3", "v").payload == err(errors.QUOTA_EXCEEDED)
        assert client.request("SET", "q1", "w").payload == OK
    finally:
        server.close()


def test_a_full_counter_59_s_ahead_does_not_wedge_the_service(backend: Backend) -> None:
    """Every client keeps getting answers, and an expiring key its DELETE notification.

    Its own server: the service clock stays ahead for a minute afterwards.
    """
    server = Backend(backend.kind)
    try:
        hostile, other = server.client("hostile"), server.client("other")
        assert other.request("KEYNOTIFY", "expiring").payload == OK
        assert other.request("SET", "expiring", "v", "PX", "400").payload == OK
        hostile_ts = now_ts("x", 59_000).replace(":00000:", ":99998:")
        assert hostile.request("SET", "h", "v", ts=hostile_ts).payload == OK
        for _ in range(3):
            assert other.request("SET", "k", "v").payload == OK
            assert other.request("DEL", "k").payload == b":1\r\n"
            assert other.request("VDEL", "k", "v").payload == b":0\r\n"
            assert hostile.request("KEYNOTIFY", "k2").payload == OK
        notes = [next_notification(other).payload for _ in range(2)]
        assert notes[-1] == b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"
    finally:
        server.close()


# ------------------------------------------------------------------ requests not executed


def test_qos0_request_is_not_executed(backend: Backend, key: bytes) -> None:
    client = backend.client()
    waiter = client.send("SET", key, "v", qos=0)
    assert_nothing(waiter, lambda: client.request("GET", "sync"))
    assert client.request("GET", key).payload == b"$-1\r\n"


@pytest.mark.parametrize("missing", ["response_topic", "correlation"])
def test_request_without_response_topic_or_correlation(
    backend: Backend, key: bytes, missing: str
) -> None:
    client = backend.client()
    options: dict[str, object] = (
        {"response_topic": None} if missing == "response_topic" else {"correlation": b""}
    )
    waiter = client.send("SET", key, "v", **options)  # type: ignore[arg-type]
    assert_nothing(waiter, lambda: client.request("GET", "sync"))
    assert client.request("GET", key).payload == b"$-1\r\n"


def test_forbidden_response_topic(backend: Backend, key: bytes) -> None:
    client = backend.client()
    client.subscribe(topics.INVOKE_TOPIC)
    # The embedded service disconnects such a client (as the real one does) instead of
    # acknowledging; on an external broker the broker acknowledges it.
    embedded = backend.kind == "embedded"
    client.send("SET", key, "v", response_topic=topics.INVOKE_TOPIC, acknowledged=not embedded)
    if embedded:
        assert client.disconnected.wait(TIMEOUT)
    observer = backend.client()
    assert observer.request("GET", key).payload == b"$-1\r\n"


# ------------------------------------------------------------------ notifications


def next_notification(client: PahoStoreClient) -> Received:
    return client.notifications.get(timeout=TIMEOUT)


def test_notifications_exact(backend: Backend, key: bytes) -> None:
    watcher, writer = backend.client("watcher"), backend.client("writer")
    registered = watcher.request("KEYNOTIFY", key)
    assert registered.payload == OK
    ts_of(registered)
    assert watcher.request("KEYNOTIFY", key).payload == OK  # idempotent

    set_response = writer.request("SET", key, "21.5")
    note = next_notification(watcher)
    assert note.topic == topics.notify_topic(watcher.client_id, key)
    assert note.payload == b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$4\r\n21.5\r\n"
    assert note.qos == 1
    assert ts_of(note) == ts_of(set_response)

    deleted = writer.request("DEL", key)
    note = next_notification(watcher)
    assert note.payload == b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"
    assert ts_of(note) == ts_of(deleted)

    # The registrant's own changes notify it too, in order.
    for value in ("1", "2", "3"):
        watcher.request("SET", key, value)
    payloads = [next_notification(watcher).payload[-3:-2] for _ in range(3)]
    assert payloads == [b"1", b"2", b"3"]

    assert watcher.request("KEYNOTIFY", key, "STOP").payload == OK
    assert watcher.request("KEYNOTIFY", key, "STOP").payload == b":0\r\n"
    assert_nothing(watcher.notifications, lambda: writer.request("SET", key, "4"))


def test_expiry_is_active_and_notified(backend: Backend, key: bytes) -> None:
    watcher = backend.client()
    watcher.request("KEYNOTIFY", key)
    lateness = []
    for _ in range(3):
        set_version = ts_of(watcher.request("SET", key, "v", "PX", "300"))
        next_notification(watcher)  # the SET
        note = next_notification(watcher)
        # Deleted by the service, not when next touched (nothing touches it here).
        assert note.payload == b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"
        assert watcher.request("GET", key).payload == b"$-1\r\n"
        # By the service's own clock (the DELETE's __ts), never before the deadline.
        late_ms = ts_of(note).wall_ms - set_version.wall_ms - 300
        assert late_ms >= 0, late_ms
        lateness.append(late_ms)
    # And promptly: within 100 ms of the deadline (protocol.md §7), the median of three,
    # so that one expiry a loaded machine scheduled late (289 ms, seen beside a soak) fails
    # nothing, where an expiry swept once a second would be late by half that in most.
    assert sorted(lateness)[1] <= 100, lateness


def _registered_then_gone(
    backend: Backend, key: bytes, leave: Callable[[PahoStoreClient], None], **options: object
) -> None:
    watcher = backend.client("gone", **options)
    watcher.request("KEYNOTIFY", key)
    leave(watcher)
    # Back with the same client id, subscribed but not registered again.
    again = PahoStoreClient(backend.host, backend.port, watcher.client_id)
    backend.clients.append(again)
    sentinel = backend.client("sentinel")
    sentinel.request("KEYNOTIFY", key)
    deadline = time.monotonic() + TIMEOUT
    while True:  # the service may learn of the disconnect a moment after the broker
        sentinel.request("SET", key, "x")
        next_notification(sentinel)
        # A notification to `again` would leave the service before its answer to this GET
        # (one service, one connection to `again`, in order): an answer with nothing before
        # it proves the registration is gone.
        again.request("GET", key)
        if again.notifications.empty():
            return
        while not again.notifications.empty():
            again.notifications.get_nowait()
        assert time.monotonic() < deadline, "registration survived the disconnect"


def test_clean_disconnect_drops_registrations(backend: Backend, key: bytes) -> None:
    _registered_then_gone(backend, key, lambda c: c.close())


def test_dropped_socket_drops_registrations(backend: Backend, key: bytes) -> None:
    _registered_then_gone(backend, key, lambda c: c.drop())


def test_keepalive_timeout_drops_registrations(backend: Backend, key: bytes) -> None:
    def go_silent(client: PahoStoreClient) -> None:
        client.client.loop_stop()  # the socket stays open, but no more PINGREQs
        sock = client.client.socket()
        assert sock is not None
        # Until the broker closes it, 1.5 keep-alives later (mosquitto checks only every
        # few seconds, so allow more).
        sock.settimeout(20)
        while sock.recv(4096):
            pass

    _registered_then_gone(backend, key, go_silent, keepalive=1)


def test_session_takeover_drops_registrations(backend: Backend, key: bytes) -> None:
    # The old connection stays open until the new one takes it over; it must not come back
    # by itself then (paho reconnects), or the two would take each other over in turn.
    _registered_then_gone(
        backend, key, lambda c: c.client.reconnect_delay_set(min_delay=3600, max_delay=3600)
    )
