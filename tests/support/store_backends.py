"""A running state store for client tests, in this process: embedded, or on mosquitto."""

from __future__ import annotations

import asyncio
import time

from agent.config import MqttSettings
from agent.emulator.embedded import EmbeddedStateStore
from agent.emulator.external import ExternalStateStore
from agent.emulator.store import StateStore
from agent.protocol.hlc import Hlc
from agent.protocol.resp3 import encode_request
from tests.support.mosquitto import Mosquitto
from tests.support.ports import free_port

QUOTA = 500
DENIED_PREFIX = "secret/"


def _deny(client_id: str, key: bytes, access: object) -> bool:
    return not key.startswith(DENIED_PREFIX.encode())


class StoreBackend:
    """The store plus a way to take its broker down and back up on the same port."""

    kind: str
    host = "127.0.0.1"
    port: int
    store: StateStore

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def broker_down(self) -> None:
        raise NotImplementedError

    async def broker_up(self) -> None:
        raise NotImplementedError

    def settings(self, **overrides: object) -> MqttSettings:
        values: dict[str, object] = {
            "host": self.host,
            "port": self.port,
            "reconnect_min_s": 0.05,
            "reconnect_max_s": 0.2,
            "connect_timeout_s": 2.0,
            "keepalive_s": 5,
            "request_timeout_s": 5.0,
        }
        values.update(overrides)
        return MqttSettings.model_validate(values)

    def write_directly(self, key: bytes, value: bytes) -> None:
        """A change made while a client is away (its notification would be lost)."""
        self._directly(b"SET", key, value)

    def delete_directly(self, key: bytes) -> None:
        """A key gone while a client is away (a store that lost it, or a delete)."""
        self._directly(b"DEL", key)

    def _directly(self, *args: bytes) -> None:
        ts = str(Hlc(time.time_ns() // 1_000_000, 0, "elsewhere"))
        self.store.handle("elsewhere", encode_request(list(args)), ts)


class EmbeddedBackend(StoreBackend):
    kind = "embedded"

    def __init__(self) -> None:
        self.port = free_port()
        self.emulator = EmbeddedStateStore(self.host, self.port, quota=QUOTA, authorizer=_deny)
        self.store = self.emulator.store

    async def start(self) -> None:
        await self.emulator.start()

    async def stop(self) -> None:
        await self.emulator.stop()

    async def broker_down(self) -> None:
        await self.emulator.broker.stop()

    async def broker_up(self) -> None:
        await self.emulator.broker.start()


class MosquittoBackend(StoreBackend):
    kind = "mosquitto"

    def __init__(self) -> None:
        self.mosquitto = Mosquitto()
        self.port = self.mosquitto.port
        self.service = ExternalStateStore(
            self.mosquitto.url, quota=QUOTA, authorizer=_deny, settings=self.settings()
        )
        self.store = self.service.store

    async def start(self) -> None:
        await asyncio.to_thread(self.mosquitto.start)
        await self.service.start()

    async def stop(self) -> None:
        await self.service.stop()
        await asyncio.to_thread(self.mosquitto.stop)

    async def broker_down(self) -> None:
        await asyncio.to_thread(self.mosquitto.stop)

    async def broker_up(self) -> None:
        await asyncio.to_thread(self.mosquitto.start)
        await self.service.session.wait_connected(10)
