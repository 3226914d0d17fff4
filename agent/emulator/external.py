"""The state store served as an ordinary client of an external MQTT 5 broker (mosquitto).

Without a broker hook it trusts each request's `__srcId` for the sender, and learns of
disconnects from mosquitto's connection log lines (`log_dest topic` publishes them on
`$SYS/broker/log/N`). See the README for what this mode cannot see.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from urllib.parse import urlsplit

from agent.client.session import Session
from agent.config import MqttSettings
from agent.emulator.limits import StoreLimits
from agent.emulator.service import StoreService, monotonic_ms, wall_clock_ms
from agent.emulator.store import Authorizer, StateStore
from agent.message import Message
from agent.protocol import topics

log = logging.getLogger(__name__)

BROKER_LOG_TOPIC = "$SYS/broker/log/N"

# mosquitto 2.x notice lines that end a client's connection. A new connection with a client
# id ends any earlier one with it too: that is how an MQTT 5 session takeover shows (mosquitto
# 2.0 logs "already connected" for MQTT 3 clients only), and it comes before the new
# connection's first request.
_GONE = re.compile(
    r"^(?:\d+: )?(?:"
    r"Client (?P<a>\S+) (?:disconnected|closed its connection|has exceeded timeout)"
    r"|Socket error on client (?P<b>\S+), disconnecting"
    r"|Client (?P<c>\S+) already connected, closing old connection"
    r"|New client connected from \S+ as (?P<d>\S+) \("
    r")"
)


def client_gone_from_log_line(line: str) -> str | None:
    """The client id a mosquitto log line says has gone, or None."""
    match = _GONE.match(line.strip())
    if match is None:
        return None
    client_id = match.group("a") or match.group("b") or match.group("c") or match.group("d")
    # mosquitto ends some of these ids with the sentence's comma or period.
    return client_id.rstrip(".,") if client_id else None


def parse_mqtt_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"mqtt://{url}")
    if parts.scheme not in ("mqtt", "tcp") or not parts.hostname:
        raise ValueError(f"expected mqtt://HOST:PORT, got {url!r}")
    return parts.hostname, parts.port or 1883


class ExternalStateStore:
    def __init__(
        self,
        url: str,
        *,
        quota: int | None = None,
        authorizer: Authorizer | None = None,
        settings: MqttSettings | None = None,
        store_limits: StoreLimits | None = None,
    ) -> None:
        host, port = parse_mqtt_url(url)
        self.url = f"mqtt://{host}:{port}"
        # The service is what everyone waits for after a broker restart: reconnect quickly.
        base = settings or MqttSettings(reconnect_max_s=2.0)
        self._settings = base.model_copy(update={"host": host, "port": port})
        self.session = Session(self._settings, client_id=f"statestore-{uuid.uuid4().hex[:12]}")
        self.store = StateStore(
            wall_clock_ms, monotonic_ms, quota=quota, authorizer=authorizer, limits=store_limits
        )
        self.service = StoreService(self.store, self._publish)
        self._sends: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        # A broker that refuses the connection (or a host that does not resolve) ends the
        # start at once; one that does not answer, after three connect timeouts.
        await self.session.start(
            wait=True, timeout=self._settings.connect_timeout_s * 3, fail_fast=True
        )
        await self.session.subscribe(BROKER_LOG_TOPIC, self._on_log_line, qos=0)
        await self.session.subscribe(topics.INVOKE_TOPIC, self._on_request, qos=1)
        log.info("state store serving on the broker at %s", self.url)

    async def stop(self) -> None:
        self.service.close()
        if self._sends:
            await asyncio.wait(self._sends, timeout=2)
        await self.session.stop()

    def _on_request(self, message: Message) -> None:
        self.service.on_request(None, message)

    def _on_log_line(self, message: Message) -> None:
        client_id = client_gone_from_log_line(message.payload.decode(errors="replace"))
        if client_id is not None and client_id != self.session.client_id:
            self.service.on_client_gone(client_id)

    def _publish(self, message: Message) -> None:
        # One task each, started in the order the store produced them; the session's
        # in-flight window queues them first come, first served, so the order holds.
        task = asyncio.get_running_loop().create_task(self._send(message))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send(self, message: Message) -> None:
        try:
            await self.session.publish(
                message.topic,
                message.payload,
                qos=message.qos,
                correlation_data=message.correlation_data,
                content_type=message.content_type,
                user_properties=message.user_properties,
            )
        except Exception as exc:
            log.warning("could not publish to %s: %s", message.topic, exc)
