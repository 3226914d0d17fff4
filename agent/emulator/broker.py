"""A small embedded MQTT 5 broker on asyncio, able to host an in-process service.

It exists so that an emulated service (the state store) can sit inside the broker the way the
vendor's service does: ``intercept()`` hands it every matching PUBLISH together with the
sender's client id and all MQTT 5 properties, and ``on_disconnect()`` tells it about every
connection that ends and why.

Scope, on purpose: MQTT 5 only, QoS 0 and 1, clean start only (no persistent sessions),
retained messages, wills (without Will Delay), keep-alive enforcement, session takeover,
optional TLS (and client certificates), user names and passwords, K8S-SAT tokens,
authorization rules; no topic aliases, shared subscriptions or subscription identifiers.
Every client's cost is bounded (`limits.py`); one client's connection is `connection.py`.

All methods must be called from the event loop thread the broker was started in.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Final, Protocol

from agent.emulator import mqtt_packets as mp
from agent.emulator.authz import ClientIdentity
from agent.emulator.connection import Connection
from agent.emulator.disconnects import DisconnectReason
from agent.emulator.host import TopicAuthorizer
from agent.emulator.limits import BrokerLimits, TokenBucket
from agent.emulator.mqtt_packets import ReasonCode
from agent.message import Message

__all__ = ["Broker", "BrokerLimits", "DisconnectReason", "Message"]

logger = logging.getLogger(__name__)

_STOP_TIMEOUT_S: Final = 2.0  # how long stop() lets final DISCONNECTs drain
_ROUTE_CACHE_LIMIT: Final = 4096
_REFUSAL_LOG_INTERVAL_S: Final = 5.0  # refused connections are summed up, not logged each

InterceptHandler = Callable[[str, Message], None]
DisconnectCallback = Callable[[str, DisconnectReason], None]


class Authenticator(Protocol):
    def authenticate(self, connect: mp.Connect, certificate_subject: str | None) -> int:
        """The CONNACK reason code for this CONNECT: SUCCESS lets it in."""
        ...

    def principal_username(self, connect: mp.Connect) -> str | None:
        """The user name rules may match for this accepted CONNECT: None if it is not proven."""
        ...


@dataclass(slots=True)
class _Route:
    """Who gets a message on one topic; cached until subscriptions or clients change."""

    subscribers: list[tuple[Connection, list[mp.Subscription]]]
    handlers: list[InterceptHandler]


class Broker:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_keepalive_s: int = 0,
        receive_maximum: int = 100,
        limits: BrokerLimits | None = None,
        ssl_context: ssl.SSLContext | None = None,
        authenticator: Authenticator | None = None,
        authorizer: TopicAuthorizer | None = None,
        **limit_overrides: Any,
    ) -> None:
        """``limit_overrides`` change single fields of ``limits`` (``max_packet_size=...``)."""
        if not 0 <= max_keepalive_s <= 65_535:
            raise ValueError("max_keepalive_s must be in 0..65535")
        if not 1 <= receive_maximum <= 65_535:
            raise ValueError("receive_maximum must be in 1..65535")
        self.host = host
        self.port = port
        self.max_keepalive_s = max_keepalive_s
        self.receive_maximum = receive_maximum
        self.limits = replace(limits or BrokerLimits.default(), **limit_overrides)
        self.ssl_context = ssl_context
        self.authenticator = authenticator
        self.authorizer = authorizer
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()  # every open socket, CONNECTed or not
        self._sessions: dict[str, Connection] = {}  # client id -> its live connection
        # client id -> who it was, while the will of its ended connection is dispatched
        self._departing: dict[str, ClientIdentity] = {}
        self._connection_rate: TokenBucket | None = None
        self._unauthenticated_bytes = 0  # held by sockets whose CONNECT is not accepted yet
        self._refused = 0
        self._refusals_logged_at = 0.0
        self._intercepts: list[tuple[str, InterceptHandler]] = []
        self._disconnect_callbacks: list[DisconnectCallback] = []
        self._retained: dict[str, tuple[Message, float]] = {}
        self._routes: dict[str, _Route] = {}

    @property
    def max_packet_size(self) -> int:
        return self.limits.max_packet_size

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "mqtts" if self.ssl_context is not None else "mqtt"
        return f"{scheme}://{host}:{self.port}"

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("broker already started")
        loop = asyncio.get_running_loop()
        rate = self.limits.max_connection_rate
        self._connection_rate = TokenBucket(rate, max(1.0, rate), loop.time())
        # TLS is started by each connection itself (connection.py), after it was counted.
        self._server = await loop.create_server(
            lambda: Connection(self), self.host, self.port, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        logger.info("MQTT broker listening on %s", self.url)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        connections = list(self._connections)
        for connection in connections:
            connection.end(DisconnectReason.SERVER_SHUTDOWN, ReasonCode.SERVER_SHUTTING_DOWN)
        closed = [connection.closed for connection in connections]
        if closed:
            _, stuck = await asyncio.wait(closed, timeout=_STOP_TIMEOUT_S)
            for connection in connections:
                if not connection.closed.done():
                    connection.abort()
            if stuck:
                await asyncio.wait(stuck, timeout=_STOP_TIMEOUT_S)
        await server.wait_closed()
        self._retained.clear()
        logger.info("MQTT broker on %s stopped", self.url)

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    def intercept(self, topic_filter: str, handler: InterceptHandler) -> None:
        """Pass every client PUBLISH (and will) matching ``topic_filter`` to ``handler``.

        ``handler(sender_client_id, message)`` runs synchronously in arrival order, before the
        PUBACK goes out, so it must not block; it may schedule work. The message is also routed
        to subscribers; handlers must treat it as read-only.
        """
        if not mp.is_valid_topic_filter(topic_filter):
            raise ValueError(f"invalid topic filter {topic_filter!r}")
        self._intercepts.append((topic_filter, handler))
        self._routes.clear()

    def on_disconnect(self, callback: DisconnectCallback) -> None:
        """Call ``callback(client_id, reason)`` once for every connection that ends.

        Only connections that completed CONNECT count. The callback runs after the
        connection's subscriptions are removed and after its will (if any) was published.
        """
        self._disconnect_callbacks.append(callback)

    def publish(self, message: Message) -> None:
        """Route a broker-originated message to subscribers (intercepts do not see it)."""
        if not mp.is_valid_topic_name(message.topic):
            raise ValueError(f"invalid topic name {message.topic!r}")
        if message.qos not in (0, 1, 2):
            raise ValueError(f"QoS must be 0, 1 or 2, not {message.qos}")
        self.dispatch(message, sender=None)

    def disconnect_client(self, client_id: str, reason_code: int = 0x82) -> None:
        """Send DISCONNECT with ``reason_code`` to ``client_id`` and close it; no-op if absent."""
        if not 0 <= reason_code <= 255:
            raise ValueError("reason_code must be a byte")
        connection = self._sessions.get(client_id)
        if connection is None:
            logger.debug("disconnect_client: %s is not connected", client_id)
            return
        logger.debug("disconnecting client %s (reason 0x%02x)", client_id, reason_code)
        connection.end(DisconnectReason.KICKED, reason_code)

    def connected_clients(self) -> set[str]:
        return set(self._sessions)

    def identity(self, client_id: str) -> ClientIdentity | None:
        """Who the live connection of ``client_id`` authenticated as, or None if absent.

        While the will of a connection that ended is dispatched, who that connection was.
        """
        departing = self._departing.get(client_id)
        if departing is not None:
            return departing
        connection = self._sessions.get(client_id)
        return None if connection is None else connection.identity

    def queued_bytes(self, client_id: str) -> int | None:
        """Bytes waiting to be sent to ``client_id`` (None if it is not connected)."""
        connection = self._sessions.get(client_id)
        return None if connection is None else connection.queued_bytes()

    def open_sockets(self) -> int:
        return len(self._connections)

    # ---- ConnectionHost (host.py): what a Connection calls ------------------------------------

    def admit(self, connection: Connection) -> bool:
        """Whether a new socket may stay: within the connection count and rate."""
        now = asyncio.get_running_loop().time()
        if len(self._connections) >= self.limits.max_connections:
            why = f"{self.limits.max_connections} connections open"
        elif self._connection_rate is not None and not self._connection_rate.take(now):
            why = f"over {self.limits.max_connection_rate:g} connections per second"
        else:
            self._connections.add(connection)
            return True
        self._refused += 1
        if now - self._refusals_logged_at >= _REFUSAL_LOG_INTERVAL_S:
            logger.warning(
                "refused %d connection(s) (last from %s): %s",
                self._refused,
                connection.peer,
                why,
            )
            self._refused = 0
            self._refusals_logged_at = now
        return False

    def release(self, connection: Connection) -> None:
        self._connections.discard(connection)

    def hold_unauthenticated(self, change: int) -> bool:
        held = self._unauthenticated_bytes + change
        if change > 0 and held > self.limits.max_unauthenticated_bytes:
            return False
        self._unauthenticated_bytes = held
        return True

    def unauthenticated_bytes(self) -> int:
        """What the sockets whose CONNECT is not accepted yet hold, together."""
        return self._unauthenticated_bytes

    def authenticate(self, connect: mp.Connect, certificate_subject: str | None) -> int:
        if self.authenticator is None:
            if connect.properties.authentication_method is not None:
                return ReasonCode.BAD_AUTHENTICATION_METHOD
            return ReasonCode.SUCCESS
        return self.authenticator.authenticate(connect, certificate_subject)

    def principal_username(self, connect: mp.Connect) -> str | None:
        if self.authenticator is None:
            return connect.username  # nothing verifies names: the claimed one is taken
        return self.authenticator.principal_username(connect)

    def register(self, connection: Connection, client_id: str) -> None:
        previous = self._sessions.get(client_id)
        if previous is not None:
            # Ends the old connection completely (hooks included) before the new one is live.
            previous.end(DisconnectReason.TAKEN_OVER, ReasonCode.SESSION_TAKEN_OVER)
        self._sessions[client_id] = connection
        self._routes.clear()

    def unregister(self, connection: Connection, client_id: str) -> None:
        if self._sessions.get(client_id) is connection:
            del self._sessions[client_id]
        self._routes.clear()

    def connection_ended(
        self,
        client_id: str,
        reason: DisconnectReason,
        will: Message | None,
        identity: ClientIdentity | None,
    ) -> None:
        if will is not None:
            # A will to the store is a request: it runs as the client it was left by.
            if identity is not None:
                self._departing[client_id] = identity
            try:
                self.dispatch(will, sender=None, sender_id=client_id)
            finally:
                self._departing.pop(client_id, None)
        for callback in list(self._disconnect_callbacks):
            try:
                callback(client_id, reason)
            except Exception:
                logger.exception("on_disconnect callback failed for %s", client_id)

    def subscriptions_changed(self) -> None:
        self._routes.clear()

    def _route(self, topic: str) -> _Route:
        route = self._routes.get(topic)
        if route is None:
            if len(self._routes) >= _ROUTE_CACHE_LIMIT:
                self._routes.clear()
            subscribers = []
            for connection in self._sessions.values():
                matched = [
                    subscription
                    for topic_filter, subscription in connection.subscriptions.items()
                    if mp.topic_matches(topic_filter, topic)
                ]
                if matched:
                    subscribers.append((connection, matched))
            handlers = [
                handler
                for topic_filter, handler in self._intercepts
                if mp.topic_matches(topic_filter, topic)
            ]
            route = self._routes[topic] = _Route(subscribers, handlers)
        return route

    def dispatch(
        self, message: Message, sender: Connection | None, sender_id: str | None = None
    ) -> None:
        """Hand a message to intercepts (client messages only), the retained store, subscribers."""
        route = self._route(message.topic)
        if sender_id is not None:
            for handler in route.handlers:
                try:
                    handler(sender_id, message)
                except Exception:
                    logger.exception("intercept handler failed on %s", message.topic)
        received_at = asyncio.get_running_loop().time()
        if message.retain:
            if message.payload:
                self._retained[message.topic] = (message, received_at)
            else:
                self._retained.pop(message.topic, None)
        for connection, subscriptions in route.subscribers:
            qos = -1
            retain_as_published = False
            for subscription in subscriptions:
                if subscription.no_local and connection is sender:
                    continue
                qos = max(qos, subscription.qos)
                retain_as_published |= subscription.retain_as_published
            if qos >= 0:
                connection.deliver(
                    message,
                    min(qos, message.qos),
                    message.retain and retain_as_published,
                    received_at,
                )

    def send_retained(self, connection: Connection, subscription: mp.Subscription) -> None:
        now = asyncio.get_running_loop().time()
        for topic, (message, received_at) in list(self._retained.items()):
            expiry = message.message_expiry_interval
            if expiry is not None and now - received_at >= expiry:
                del self._retained[topic]
                continue
            if mp.topic_matches(subscription.topic_filter, topic):
                connection.deliver(message, min(message.qos, subscription.qos), True, received_at)
