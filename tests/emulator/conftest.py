"""Helpers to drive the embedded broker from synchronous tests.

The broker runs on its own event loop in a background thread, so paho (which has its own
network thread) and plain blocking sockets can talk to it from ordinary test functions.
Everything that waits does so on an event with a timeout; nothing sleeps in place of one.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Generic, TypeVar

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.reasoncodes import ReasonCode as PahoReasonCode

from agent.emulator import mqtt_packets as mp
from agent.emulator.broker import Broker, DisconnectReason

TIMEOUT = 2.0
T = TypeVar("T")


class EventLog(Generic[T]):
    """A thread-safe list that tests can wait on."""

    def __init__(self) -> None:
        self._items: list[T] = []
        self._changed = threading.Condition()

    def append(self, item: T) -> None:
        with self._changed:
            self._items.append(item)
            self._changed.notify_all()

    @property
    def items(self) -> list[T]:
        with self._changed:
            return list(self._items)

    def wait_for(self, predicate: Callable[[T], bool], timeout: float = TIMEOUT) -> T:
        """The first item matching ``predicate``, waiting for it to arrive if needed."""
        found: list[T] = []

        def match() -> bool:
            found[:] = [item for item in self._items if predicate(item)][:1]
            return bool(found)

        with self._changed:
            if not self._changed.wait_for(match, timeout):
                raise AssertionError(f"no matching event within {timeout}s; have {self._items}")
        return found[0]

    def wait_count(self, count: int, timeout: float = TIMEOUT) -> list[T]:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._items) >= count, timeout):
                raise AssertionError(f"expected {count} events, have {self._items}")
            return list(self._items)


class _ErrorCollector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class LoopThread:
    """A private event loop on its own thread, to drive asyncio servers from blocking tests."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._on_loop_error)
        self.loop_errors: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.loop_errors.append(context)
        loop.default_exception_handler(context)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = TIMEOUT) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call(self, function: Callable[..., T], *args: Any) -> T:
        """Run ``function`` on the loop thread, as the servers' APIs require."""

        async def invoke() -> T:
            return function(*args)

        return self.run(invoke())

    def stop_loop(self, last: Coroutine[Any, Any, None]) -> None:
        """Runs ``last`` (the server's stop), then ends the loop and its thread."""
        try:
            self.run(last, TIMEOUT * 5)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(TIMEOUT)
            self.loop.close()


class BrokerThread(LoopThread):
    """A running ``Broker`` on a private event loop thread, plus a log of its disconnects."""

    def __init__(self, **options: Any) -> None:
        super().__init__("broker")
        self.broker = Broker(**options)
        self.disconnects: EventLog[tuple[str, DisconnectReason]] = EventLog()
        # ERROR records logged by the broker; a test expecting some clears this list.
        self.logged_errors: list[logging.LogRecord] = []

    def start(self) -> None:
        self.run(self.broker.start())
        self.call(self.broker.on_disconnect, lambda *event: self.disconnects.append(event))

    @property
    def port(self) -> int:
        return self.broker.port

    def stop(self) -> None:
        self.stop_loop(self.broker.stop())


@pytest.fixture
def broker_factory() -> Iterator[Callable[..., BrokerThread]]:
    """Start brokers with custom options; all are stopped (and checked for errors) at the end."""
    started: list[BrokerThread] = []
    errors = _ErrorCollector()
    logging.getLogger("agent.emulator").addHandler(errors)

    def start(**options: Any) -> BrokerThread:
        broker = BrokerThread(**options)
        broker.logged_errors = errors.records
        broker.start()
        started.append(broker)
        return broker

    try:
        yield start
    finally:
        logging.getLogger("agent.emulator").removeHandler(errors)
        for broker in started:
            broker.stop()
    for broker in started:
        assert not broker.loop_errors, f"unhandled errors in the broker loop: {broker.loop_errors}"
    assert not errors.records, f"broker logged errors: {[r.getMessage() for r in errors.records]}"


@pytest.fixture
def mqtt_broker(broker_factory: Callable[..., BrokerThread]) -> BrokerThread:
    """A broker with default options."""
    return broker_factory()


class PahoClient:
    """A paho-mqtt v5 client on its own network thread, with waitable callbacks."""

    def __init__(
        self,
        port: int,
        client_id: str = "",
        *,
        protocol: int = paho.MQTTv5,
        manual_ack: bool = False,
    ) -> None:
        self.port = port
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            reconnect_on_failure=False,  # a reconnect would race the tests' takeovers
            manual_ack=manual_ack,
        )
        self.connacks: EventLog[tuple[paho.ConnectFlags, PahoReasonCode, Any]] = EventLog()
        self.disconnects: EventLog[PahoReasonCode] = EventLog()
        self.sub_acks: EventLog[tuple[int, list[PahoReasonCode]]] = EventLog()
        self.messages: queue.Queue[paho.MQTTMessage] = queue.Queue()
        self.client.on_connect = lambda _c, _u, flags, rc, props: self.connacks.append(
            (flags, rc, props)
        )
        self.client.on_disconnect = lambda _c, _u, _flags, rc, _props: self.disconnects.append(rc)
        self.client.on_subscribe = lambda _c, _u, mid, codes, _props: self.sub_acks.append(
            (mid, codes)
        )
        self.client.on_unsubscribe = lambda _c, _u, mid, codes, _props: self.sub_acks.append(
            (mid, codes)
        )
        self.client.on_message = lambda _c, _u, message: self.messages.put(message)

    def connect(
        self, keepalive: int = 60, properties: PahoProperties | None = None
    ) -> tuple[paho.ConnectFlags, PahoReasonCode, Any]:
        if self.client.protocol == paho.MQTTv5:
            self.client.connect(
                "127.0.0.1", self.port, keepalive, clean_start=True, properties=properties
            )
        else:
            self.client.connect("127.0.0.1", self.port, keepalive)
        self.client.loop_start()
        return self.connacks.wait_for(lambda _: True)

    def subscribe(
        self, topic_filter: str, qos: int = 1, options: paho.SubscribeOptions | None = None
    ) -> list[int]:
        if options is not None:
            _, mid = self.client.subscribe(topic_filter, options=options)
        else:
            _, mid = self.client.subscribe(topic_filter, qos)
        _, codes = self.sub_acks.wait_for(lambda ack: ack[0] == mid)
        return [code.value for code in codes]

    def unsubscribe(self, topic_filter: str) -> list[int]:
        _, mid = self.client.unsubscribe(topic_filter)
        _, codes = self.sub_acks.wait_for(lambda ack: ack[0] == mid)
        return [code.value for code in codes]

    def publish(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 1,
        *,
        retain: bool = False,
        properties: PahoProperties | None = None,
    ) -> None:
        """Publish and, for QoS 1, wait for the PUBACK."""
        info = self.client.publish(topic, payload, qos, retain, properties)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"no PUBACK for {topic}"

    def next_message(self, timeout: float = TIMEOUT) -> paho.MQTTMessage:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no message within {timeout}s") from None

    def close(self) -> None:
        if self.client.is_connected():
            self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def paho_factory() -> Iterator[Callable[..., PahoClient]]:
    """Make paho clients (not yet connected); all are closed at the end of the test."""
    clients: list[PahoClient] = []

    def make(port: int, client_id: str = "", **options: Any) -> PahoClient:
        client = PahoClient(port, client_id, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


class RawClient:
    """A blocking socket speaking MQTT through our codec, for what paho cannot do."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.reader = mp.PacketReader()

    def send(self, *packets: mp.Packet) -> None:
        self.sock.sendall(b"".join(mp.encode(packet) for packet in packets))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self, timeout: float = TIMEOUT) -> mp.Packet | None:
        """The next packet, or None once the broker closed the connection."""
        self.sock.settimeout(timeout)
        while (packet := self.reader.next_packet()) is None:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.reader.feed(data)
        return packet

    def receive_raw_until_closed(self) -> bytes:
        chunks = []
        while data := self.sock.recv(65536):
            chunks.append(data)
        return b"".join(chunks)

    def expect(self, packet_type: type[T], timeout: float = TIMEOUT) -> T:
        packet = self.receive(timeout)
        assert isinstance(packet, packet_type), f"expected {packet_type.__name__}, got {packet!r}"
        return packet

    def expect_closed(self, timeout: float = TIMEOUT) -> None:
        packet = self.receive(timeout)
        assert packet is None, f"expected the broker to close, got {packet!r}"

    def assert_silent(self, timeout: float) -> None:
        """Nothing arrives within ``timeout`` (for things that must not happen)."""
        try:
            packet = self.receive(timeout)
        except TimeoutError:
            return
        raise AssertionError(f"expected silence, got {packet!r}")

    def connect(self, client_id: str, keep_alive: int = 0, **options: Any) -> mp.Connack:
        self.send(mp.Connect(client_id, keep_alive=keep_alive, **options))
        connack = self.expect(mp.Connack)
        assert connack.reason_code == 0
        return connack

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw_factory() -> Iterator[Callable[[int], RawClient]]:
    clients: list[RawClient] = []

    def make(port: int) -> RawClient:
        client = RawClient(port)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


class EmulatorThread(LoopThread):
    """An ``EmbeddedStateStore`` on a private event loop thread, for blocking clients."""

    def __init__(self, **options: Any) -> None:
        from agent.emulator.embedded import EmbeddedStateStore

        super().__init__("emulator")

        async def make() -> EmbeddedStateStore:
            return EmbeddedStateStore(**options)

        self.emulator = self.run(make())
        self.run(self.emulator.start(), TIMEOUT * 5)

    @property
    def port(self) -> int:
        return self.emulator.port

    def stop(self) -> None:
        """Stops the emulator (once: a test may stop it before the fixture does)."""
        if not self.loop.is_closed():
            self.stop_loop(self.emulator.stop())


@pytest.fixture
def emulator_factory() -> Iterator[Callable[..., EmulatorThread]]:
    started: list[EmulatorThread] = []

    def start(**options: Any) -> EmulatorThread:
        emulator = EmulatorThread(**options)
        started.append(emulator)
        return emulator

    yield start
    for emulator in started:
        emulator.stop()
    for emulator in started:
        assert not emulator.loop_errors, f"unhandled errors in the loop: {emulator.loop_errors}"
