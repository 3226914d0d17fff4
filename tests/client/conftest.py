"""Brokers for the session tests: a scripted raw MQTT listener, mosquitto with TLS or passwords."""

from __future__ import annotations

import asyncio
import getpass
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agent.client.session import Message, Session
from agent.config import MqttSettings
from agent.emulator import mqtt_packets
from tests.support.mosquitto import Mosquitto, mosquitto_binary
from tests.support.pki import KEY_PASSWORD, Pki, make_pki
from tests.support.secured_broker import SecuredMosquitto

__all__ = ["KEY_PASSWORD", "Pki"]

# --- A raw listener that plays a broker just far enough to read CONNECT ----------------------


@dataclass
class Connect:
    """What a CONNECT packet said."""

    protocol_level: int
    flags: int
    keepalive: int
    at: float
    raw: bytes  # the whole packet, as sent

    def decoded(self) -> mqtt_packets.Connect:
        """The packet as the project's own MQTT codec reads it."""
        reader = mqtt_packets.PacketReader()
        reader.feed(self.raw)
        packet = reader.next_packet()
        assert isinstance(packet, mqtt_packets.Connect), packet
        return packet

    @property
    def clean_start(self) -> bool:
        return bool(self.flags & 0x02)

    @property
    def has_username(self) -> bool:
        return bool(self.flags & 0x80)


async def _read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    header = (await reader.readexactly(1))[0]
    length, multiplier = 0, 1
    while True:
        byte = (await reader.readexactly(1))[0]
        length += (byte & 0x7F) * multiplier
        multiplier *= 128
        if not byte & 0x80:
            break
    return header, await reader.readexactly(length)


def _variable_byte_integer(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value % 128, value // 128
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _first_filter(subscribe_body: bytes) -> str:
    index, length, shift = 2, 0, 0
    while True:  # Variable Byte Integer: length of the properties
        byte = subscribe_body[index]
        index += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    index += length
    size = int.from_bytes(subscribe_body[index : index + 2], "big")
    return subscribe_body[index + 2 : index + 2 + size].decode()


class RawBroker:
    """Accepts TCP connections, reads the CONNECT and answers with ``reply`` (or never).

    After that it answers every SUBSCRIBE with a SUBACK carrying ``suback_code``, every PUBLISH
    with ``publish_reply`` (if any) and ignores everything else (QoS 1 publishes get no PUBACK).
    """

    def __init__(
        self, reply: bytes | None, suback_code: int = 0x01, publish_reply: bytes | None = None
    ) -> None:
        self.reply = reply
        self.suback_code = suback_code
        self.publish_reply = publish_reply
        self.connects: list[Connect] = []
        self.subscribed: list[str] = []
        self.closed_by_client = 0
        self.port = 0
        self._changed = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            header, body = await _read_packet(reader)
            assert header == 0x10, f"expected CONNECT, got {header:#x}"
            name_length = int.from_bytes(body[:2], "big")
            level, flags = body[2 + name_length], body[3 + name_length]
            keepalive = int.from_bytes(body[4 + name_length : 6 + name_length], "big")
            raw = bytes([header]) + _variable_byte_integer(len(body)) + body
            async with self._changed:
                self.connects.append(Connect(level, flags, keepalive, time.monotonic(), raw))
                self._changed.notify_all()
            if self.reply is not None:
                writer.write(self.reply)
                await writer.drain()
            while True:  # until the client closes the connection (FIN, or RST on abort)
                try:
                    header, body = await _read_packet(reader)
                except (asyncio.IncompleteReadError, ConnectionResetError):
                    break
                if header == 0x82:  # SUBSCRIBE: packet id, properties, filter(s)
                    self.subscribed.append(_first_filter(body))
                    writer.write(bytes([0x90, 0x04, body[0], body[1], 0x00, self.suback_code]))
                elif header & 0xF0 == 0x30 and self.publish_reply is not None:
                    writer.write(self.publish_reply)
            async with self._changed:
                self.closed_by_client += 1
                self._changed.notify_all()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def drop_clients(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()

    async def wait_for(self, predicate: Callable[[], bool], within: float = 5.0) -> None:
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(predicate)


RawBrokerFactory = Callable[..., Awaitable[RawBroker]]
"""What the `raw_broker` fixture gives a test."""


@pytest.fixture
async def raw_broker() -> AsyncIterator[RawBrokerFactory]:
    """Factory: ``broker = await raw_broker(connect_reply_or_None[, suback_code])``."""
    brokers: list[RawBroker] = []

    async def make(
        reply: bytes | None, suback_code: int = 0x01, publish_reply: bytes | None = None
    ) -> RawBroker:
        broker = RawBroker(reply, suback_code, publish_reply)
        await broker.start()
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        await broker.stop()


# --- Settings and log watching ---------------------------------------------------------------


def fast_settings(port: int, **overrides: object) -> MqttSettings:
    """Settings for tests: quick reconnects and short timeouts."""
    values: dict[str, object] = {
        "host": "127.0.0.1",
        "port": port,
        "reconnect_min_s": 0.05,
        "reconnect_max_s": 0.2,
        "connect_timeout_s": 2.0,
        "request_timeout_s": 5.0,
    }
    values.update(overrides)
    return MqttSettings.model_validate(values)


class LogWatch(logging.Handler):
    """Collects the session's log records and lets a test await one that contains a text."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self._loop.call_soon_threadsafe(self._changed.set)

    def matching(self, text: str) -> list[logging.LogRecord]:
        return [r for r in self.records if text in r.getMessage()]

    async def wait_for_count(
        self, text: str, count: int, within: float = 5.0
    ) -> list[logging.LogRecord]:
        """Wait until ``count`` records contain ``text``; return them all."""
        async with asyncio.timeout(within):
            while len(self.matching(text)) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.matching(text)

    async def wait_for(self, text: str, within: float = 5.0) -> logging.LogRecord:
        async with asyncio.timeout(within):
            while not self.matching(text):
                self._changed.clear()
                await self._changed.wait()
        return self.matching(text)[0]


@pytest.fixture
async def log_watch() -> AsyncIterator[LogWatch]:
    logger = logging.getLogger("agent.client.session")
    watch = LogWatch()
    previous = logger.level
    logger.addHandler(watch)
    logger.setLevel(logging.DEBUG)
    try:
        yield watch
    finally:
        logger.removeHandler(watch)
        logger.setLevel(previous)


# --- mosquitto with a configuration of our own -----------------------------------------------


class ConfiguredMosquitto(Mosquitto):
    """tests.support's mosquitto, with a configuration written by the test ({port} filled in)."""

    def __init__(self, config: str) -> None:
        super().__init__()
        # Started as root, mosquitto switches to user "mosquitto", which cannot read certificates
        # or password files in pytest's private temporary directories. Ignored when not root.
        user = f"user {getpass.getuser()}\n"
        self._conf.write_text(user + config.format(port=self.port))


@pytest.fixture
def configured_mosquitto() -> Iterator[Callable[[str], ConfiguredMosquitto]]:
    if mosquitto_binary() is None:
        pytest.skip("mosquitto is not installed")
    brokers: list[ConfiguredMosquitto] = []

    def make(config: str) -> ConfiguredMosquitto:
        broker = ConfiguredMosquitto(config)
        brokers.append(broker)
        broker.start()
        return broker

    yield make
    for broker in brokers:
        broker.stop()


@pytest.fixture
def secured() -> Iterator[Callable[..., SecuredMosquitto]]:
    """Factory: ``secured(pki, require_certificate=..., users=..., server_cert=...)``."""
    if mosquitto_binary() is None:
        pytest.skip("mosquitto is not installed")
    brokers: list[SecuredMosquitto] = []

    def make(pki: Pki, **options: Any) -> SecuredMosquitto:
        broker = SecuredMosquitto(pki, **options)
        brokers.append(broker)
        broker.start()
        return broker

    yield make
    for broker in brokers:
        broker.stop()


# --- Throwaway PKI ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# --- Sessions for the tests ---------------------------------------------------------------


def unique(prefix: str = "test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def started(settings: MqttSettings, client_id: str | None = None) -> Session:
    session = Session(settings, client_id=client_id or unique())
    await session.start(timeout=5)
    return session


class Inbox:
    """A sync handler that keeps messages and lets the test await them."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Message] = asyncio.Queue()

    def __call__(self, message: Message) -> None:
        self.queue.put_nowait(message)

    async def get(self, within: float = 5.0) -> Message:
        return await asyncio.wait_for(self.queue.get(), within)
