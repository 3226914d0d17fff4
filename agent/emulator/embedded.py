"""The state store hosted inside our own MQTT 5 broker, in this process."""

from __future__ import annotations

import logging
from types import TracebackType

from agent.emulator.broker import Broker, DisconnectReason
from agent.emulator.service import StoreService, monotonic_ms, wall_clock_ms
from agent.emulator.store import Authorizer, StateStore
from agent.protocol import topics

log = logging.getLogger(__name__)

# MQTT reason code "Protocol Error": the real service disconnects clients that ask for a
# forbidden response topic.
_PROTOCOL_ERROR = 0x82


class EmbeddedStateStore:
    """`async with EmbeddedStateStore() as emulator:` serves at `emulator.url`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        quota: int | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.broker = Broker(host, port)
        self.store = StateStore(wall_clock_ms, monotonic_ms, quota=quota, authorizer=authorizer)
        self.service = StoreService(
            self.store,
            self.broker.publish,
            lambda client_id: self.broker.disconnect_client(client_id, _PROTOCOL_ERROR),
        )
        self.broker.intercept(topics.INVOKE_TOPIC, self.service.on_request)
        self.broker.on_disconnect(self._client_gone)

    def _client_gone(self, client_id: str, reason: DisconnectReason) -> None:
        self.service.on_client_gone(client_id)

    @property
    def host(self) -> str:
        return self.broker.host

    @property
    def port(self) -> int:
        return self.broker.port

    @property
    def url(self) -> str:
        return self.broker.url

    async def start(self) -> None:
        await self.broker.start()
        log.info("state store serving at %s", self.url)

    async def stop(self) -> None:
        self.service.close()
        await self.broker.stop()

    async def __aenter__(self) -> EmbeddedStateStore:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
