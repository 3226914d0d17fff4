"""A small embedded MQTT 5 broker on asyncio, able to host an in-process service.

It exists so that an emulated service (the state store) can sit inside the broker the way the
vendor's service does: ``intercept()`` hands it every matching PUBLISH together with the
sender's client id and all MQTT 5 properties, and ``on_disconnect()`` tells it about every
connection that ends and why.

Scope, on purpose: MQTT 5 only, QoS 0 and 1, clean start only (no persistent sessions),
retained messages, wills (without Will Delay), keep-alive enforcement, session takeover,
no authentication, no topic aliases, shared subscriptions or subscription identifiers.

All methods must be called from the event loop thread the broker was started in.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import socket
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Final

from agent.emulator import mqtt_packets as mp
from agent.emulator.mqtt_packets import ReasonCode
from agent.message import Message

logger = logging.getLogger(__name__)

_KEEPALIVE_GRACE: Final = 1.5  # the spec's "one and a half times the Keep Alive"
_CONNECT_TIMEOUT_S: Final = 10.0  # a socket that never sends CONNECT is closed after this
_STOP_TIMEOUT_S: Final = 2.0  # how long stop() lets final DISCONNECTs drain
_ROUTE_CACHE_LIMIT: Final = 4096
_DEFAULT_RECEIVE_MAXIMUM: Final = 65_535
# A 3.1.1 CONNACK with return code 0x01 (unacceptable protocol version), which 3.1.1 and
# 3.1 clients understand; an MQTT 5 CONNACK would be gibberish to them.
_MQTT311_CONNACK_BAD_PROTOCOL: Final = b"\x20\x02\x00\x01"


class DisconnectReason(enum.Enum):
    CLEAN = "clean"  # the client sent DISCONNECT
    DROPPED = "dropped"  # the network connection closed without DISCONNECT
    KEEPALIVE_TIMEOUT = "keepalive_timeout"
    TAKEN_OVER = "taken_over"  # another connection used the same client id
    PROTOCOL_ERROR = "protocol_error"  # malformed packet or protocol violation
    KICKED = "kicked"  # Broker.disconnect_client()
    SERVER_SHUTDOWN = "server_shutdown"  # Broker.stop()


InterceptHandler = Callable[[str, Message], None]
DisconnectCallback = Callable[[str, DisconnectReason], None]


@dataclass(slots=True)
class _Pending:
    """A QoS 1 delivery waiting for room in the subscriber's receive window."""

    message: Message
    retain: bool
    received_at: float


@dataclass(slots=True)
class _Route:
    """Who gets a message on one topic; cached until subscriptions or clients change."""

    subscribers: list[tuple[_Connection, list[mp.Subscription]]]
    handlers: list[InterceptHandler]


class Broker:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_keepalive_s: int = 0,
        receive_maximum: int = 100,
        max_packet_size: int = 16 * 1024 * 1024,
    ) -> None:
        if not 0 <= max_keepalive_s <= 65_535:
            raise ValueError("max_keepalive_s must be in 0..65535")
        if not 1 <= receive_maximum <= 65_535:
            raise ValueError("receive_maximum must be in 1..65535")
        if not 64 <= max_packet_size <= mp.MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size must be in 64..{mp.MAX_PACKET_SIZE}")
        self.host = host
        self.port = port
        self.max_keepalive_s = max_keepalive_s
        self.receive_maximum = receive_maximum
        self.max_packet_size = max_packet_size
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()  # every open socket, CONNECTed or not
        self._sessions: dict[str, _Connection] = {}  # client id -> its live connection
        self._intercepts: list[tuple[str, InterceptHandler]] = []
        self._disconnect_callbacks: list[DisconnectCallback] = []
        self._retained: dict[str, tuple[Message, float]] = {}
        self._routes: dict[str, _Route] = {}

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"mqtt://{host}:{self.port}"

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("broker already started")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), self.host, self.port, reuse_address=True
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
        self._dispatch(message, sender=None)

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

    # ---- used by _Connection -----------------------------------------------------------------

    def _register(self, connection: _Connection, client_id: str) -> None:
        previous = self._sessions.get(client_id)
        if previous is not None:
            # Ends the old connection completely (hooks included) before the new one is live.
            previous.end(DisconnectReason.TAKEN_OVER, ReasonCode.SESSION_TAKEN_OVER)
        self._sessions[client_id] = connection
        self._routes.clear()

    def _unregister(self, connection: _Connection, client_id: str) -> None:
        if self._sessions.get(client_id) is connection:
            del self._sessions[client_id]
        self._routes.clear()

    def _connection_ended(
        self, client_id: str, reason: DisconnectReason, will: Message | None
    ) -> None:
        if will is not None:
            self._dispatch(will, sender=None, sender_id=client_id)
        for callback in list(self._disconnect_callbacks):
            try:
                callback(client_id, reason)
            except Exception:
                logger.exception("on_disconnect callback failed for %s", client_id)

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

    def _dispatch(
        self, message: Message, sender: _Connection | None, sender_id: str | None = None
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

    def _send_retained(self, connection: _Connection, subscription: mp.Subscription) -> None:
        now = asyncio.get_running_loop().time()
        for topic, (message, received_at) in list(self._retained.items()):
            expiry = message.message_expiry_interval
            if expiry is not None and now - received_at >= expiry:
                del self._retained[topic]
                continue
            if mp.topic_matches(subscription.topic_filter, topic):
                connection.deliver(message, min(message.qos, subscription.qos), True, received_at)


class _Connection(asyncio.Protocol):
    """One client socket: decodes packets, enforces the protocol, sends deliveries."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._reader = mp.PacketReader(broker.max_packet_size)
        self.peer = "?"
        self.client_id: str | None = None  # set once the CONNECT is accepted
        self.subscriptions: dict[str, mp.Subscription] = {}
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._ended = False
        self._will: Message | None = None
        self._keep_alive_s = 0
        self._last_packet_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._receive_maximum = _DEFAULT_RECEIVE_MAXIMUM  # the client's, for our QoS 1 sends
        self._client_max_packet_size = mp.MAX_PACKET_SIZE
        self._inflight: set[int] = set()
        self._pending: deque[_Pending] = deque()
        self._next_packet_id = 1
        self._out: list[bytes] = []
        self._flush_scheduled = False

    def __repr__(self) -> str:
        return f"<_Connection {self.client_id or '(connecting)'} {self.peer}>"

    # ---- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peername = transport.get_extra_info("peername")
        self.peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        self._broker._connections.add(self)
        self._last_packet_at = self._loop.time()
        self._timer = self._loop.call_later(_CONNECT_TIMEOUT_S, self._on_timer)
        logger.debug("connection from %s", self.peer)

    def data_received(self, data: bytes) -> None:
        if self._ended:
            return
        self._reader.feed(data)
        try:
            while not self._ended:
                if self.client_id is None and self._reader.next_packet_type not in (
                    None,
                    mp.PacketType.CONNECT,
                ):
                    # Decided from the first byte: do not wait for the rest of a non-CONNECT.
                    logger.warning("closing %s: first packet is not CONNECT", self.peer)
                    self.end(DisconnectReason.PROTOCOL_ERROR, None)
                    return
                packet = self._reader.next_packet()
                if packet is None:
                    break
                self._last_packet_at = self._loop.time()
                self._handle(packet)
        except mp.MalformedPacket as error:
            self._on_malformed(error)
        except Exception:
            logger.exception("internal error handling a packet from %r", self)
            self.end(DisconnectReason.PROTOCOL_ERROR, ReasonCode.UNSPECIFIED_ERROR)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._ended:
            self.end(DisconnectReason.DROPPED, None, publish_will=True)
        self._transport = None
        if not self.closed.done():
            self.closed.set_result(None)

    # ---- ending ------------------------------------------------------------------------------

    def end(
        self,
        reason: DisconnectReason,
        reason_code: int | None,
        *,
        publish_will: bool | None = None,
    ) -> None:
        """End this connection once: optional final DISCONNECT, close, cleanup, hooks.

        ``reason_code`` None sends nothing. The will is published unless the client asked for
        a normal disconnect or the server is shutting down (``publish_will`` overrides).
        """
        if self._ended:
            return
        self._ended = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if reason_code is not None and self.client_id is not None:
            self._send(mp.Disconnect(reason_code))
        self._close_transport()
        self._broker._connections.discard(self)
        client_id = self.client_id
        if client_id is None:
            logger.debug("connection from %s closed before CONNECT completed", self.peer)
            return
        self._broker._unregister(self, client_id)
        self.subscriptions.clear()
        self._pending.clear()
        if publish_will is None:
            publish_will = reason is not DisconnectReason.SERVER_SHUTDOWN
        will = self._will if publish_will else None
        self._will = None
        logger.info("client %s disconnected (%s)", client_id, reason.value)
        self._broker._connection_ended(client_id, reason, will)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _close_transport(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self._flush()
        transport.close()

    def _protocol_error(self, reason_code: int, why: str) -> None:
        logger.warning("closing %r: %s (reason 0x%02x)", self, why, reason_code)
        self.end(DisconnectReason.PROTOCOL_ERROR, reason_code)

    def _on_malformed(self, error: mp.MalformedPacket) -> None:
        if self.client_id is not None:
            self._protocol_error(error.reason_code, str(error))
            return
        logger.warning("closing connection from %s before CONNECT: %s", self.peer, error)
        if isinstance(error, mp.UnsupportedProtocolVersion) and error.protocol_level in (3, 4):
            self._write_raw(_MQTT311_CONNACK_BAD_PROTOCOL)
        elif error.packet_type is mp.PacketType.CONNECT:
            self._send(mp.Connack(error.reason_code))
        self.end(DisconnectReason.PROTOCOL_ERROR, None)

    def _on_timer(self) -> None:
        self._timer = None
        if self._ended:
            return
        if self.client_id is None:
            logger.warning("closing connection from %s: no CONNECT received", self.peer)
            self.end(DisconnectReason.PROTOCOL_ERROR, None)
            return
        limit = self._keep_alive_s * _KEEPALIVE_GRACE
        idle = self._loop.time() - self._last_packet_at
        if idle >= limit:
            logger.info("client %s: keep-alive of %ss expired", self.client_id, self._keep_alive_s)
            self.end(DisconnectReason.KEEPALIVE_TIMEOUT, ReasonCode.KEEP_ALIVE_TIMEOUT)
        else:
            # Re-arming only when the timer fires keeps per-packet cost to one clock read.
            self._timer = self._loop.call_later(limit - idle, self._on_timer)

    # ---- output ------------------------------------------------------------------------------

    def _send(self, packet: mp.Packet) -> None:
        self._write_raw(mp.encode(packet))

    def _write_raw(self, data: bytes) -> None:
        self._out.append(data)
        if not self._flush_scheduled:
            # Batch everything produced in this loop iteration into one write.
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out:
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    # ---- input -------------------------------------------------------------------------------

    def _handle(self, packet: mp.Packet) -> None:
        if self.client_id is None:
            if isinstance(packet, mp.Connect):
                self._handle_connect(packet)
            else:
                logger.warning("closing %s: first packet is not CONNECT", self.peer)
                self.end(DisconnectReason.PROTOCOL_ERROR, None)
            return
        logger.debug("%s -> %r", self.client_id, packet)
        if isinstance(packet, mp.Publish):
            self._handle_publish(packet)
        elif isinstance(packet, mp.Puback):
            self._handle_puback(packet)
        elif isinstance(packet, mp.Pingreq):
            self._send(mp.Pingresp())
        elif isinstance(packet, mp.Subscribe):
            self._handle_subscribe(packet)
        elif isinstance(packet, mp.Unsubscribe):
            self._handle_unsubscribe(packet)
        elif isinstance(packet, mp.Disconnect):
            # 0x04 "disconnect with will message" is the one normal way to keep the will.
            keep_will = packet.reason_code != ReasonCode.NORMAL_DISCONNECTION
            self.end(DisconnectReason.CLEAN, None, publish_will=keep_will)
        else:
            # A second CONNECT, server-to-client packets, QoS 2 flow packets (we never grant
            # QoS 2) and AUTH (no enhanced authentication was negotiated).
            self._protocol_error(
                ReasonCode.PROTOCOL_ERROR, f"unexpected {type(packet).__name__} packet"
            )

    def _refuse_connect(self, reason_code: int, why: str) -> None:
        logger.warning("refusing CONNECT from %s: %s", self.peer, why)
        self._send(mp.Connack(reason_code))
        self.end(DisconnectReason.PROTOCOL_ERROR, None)

    def _handle_connect(self, packet: mp.Connect) -> None:
        props = packet.properties
        will = packet.will
        if props.authentication_method is not None:
            self._refuse_connect(ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication")
            return
        if will is not None and will.qos > 1:
            self._refuse_connect(ReasonCode.QOS_NOT_SUPPORTED, "will QoS 2")
            return
        if will is not None and not mp.is_valid_topic_name(will.topic):
            self._refuse_connect(ReasonCode.TOPIC_NAME_INVALID, f"will topic {will.topic!r}")
            return

        broker = self._broker
        connack = mp.Properties(
            receive_maximum=broker.receive_maximum,
            maximum_qos=1,
            retain_available=1,
            maximum_packet_size=broker.max_packet_size,
            topic_alias_maximum=0,
            wildcard_subscription_available=1,
            subscription_identifier_available=0,
            shared_subscription_available=0,
        )
        if props.session_expiry_interval:
            connack.session_expiry_interval = 0  # no persistent sessions
        client_id = packet.client_id
        if not client_id:
            client_id = connack.assigned_client_identifier = f"auto-{uuid.uuid4().hex}"
        keep_alive = packet.keep_alive
        if broker.max_keepalive_s and (keep_alive == 0 or keep_alive > broker.max_keepalive_s):
            keep_alive = connack.server_keep_alive = broker.max_keepalive_s
        self._keep_alive_s = keep_alive
        self._receive_maximum = props.receive_maximum or _DEFAULT_RECEIVE_MAXIMUM
        self._client_max_packet_size = props.maximum_packet_size or mp.MAX_PACKET_SIZE
        if will is not None:
            self._will = _message_from(
                will.topic, will.payload, will.qos, will.retain, will.properties
            )

        broker._register(self, client_id)
        self.client_id = client_id
        self._send(mp.Connack(ReasonCode.SUCCESS, False, connack))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if keep_alive:
            self._timer = self._loop.call_later(keep_alive * _KEEPALIVE_GRACE, self._on_timer)
        logger.info(
            "client %s connected from %s (keep-alive %ss)", client_id, self.peer, keep_alive
        )

    def _handle_publish(self, packet: mp.Publish) -> None:
        props = packet.properties
        if packet.qos > 1:
            self._protocol_error(ReasonCode.QOS_NOT_SUPPORTED, "QoS 2 PUBLISH")
            return
        if props.topic_alias is not None:
            self._protocol_error(ReasonCode.TOPIC_ALIAS_INVALID, "topic alias (maximum is 0)")
            return
        if props.subscription_identifiers:
            self._protocol_error(ReasonCode.PROTOCOL_ERROR, "subscription identifier in PUBLISH")
            return
        if not mp.is_valid_topic_name(packet.topic):
            reason = ReasonCode.TOPIC_NAME_INVALID if packet.topic else ReasonCode.PROTOCOL_ERROR
            self._protocol_error(reason, f"invalid topic name {packet.topic!r}")
            return
        message = _message_from(packet.topic, packet.payload, packet.qos, packet.retain, props)
        assert self.client_id is not None
        self._broker._dispatch(message, sender=self, sender_id=self.client_id)
        if packet.packet_id is not None and not self._ended:
            # The bytes of encode(Puback(packet_id)) (success, no properties), without the
            # generic encoder: every QoS 1 PUBLISH costs one.
            self._write_raw(b"\x40\x02" + packet.packet_id.to_bytes(2, "big"))

    def _handle_puback(self, packet: mp.Puback) -> None:
        try:
            self._inflight.remove(packet.packet_id)
        except KeyError:
            logger.debug("%s: PUBACK for unknown packet id %d", self.client_id, packet.packet_id)
            return
        while self._pending and len(self._inflight) < self._receive_maximum:
            pending = self._pending.popleft()
            self._send_publish(pending.message, 1, pending.retain, pending.received_at)

    def _handle_subscribe(self, packet: mp.Subscribe) -> None:
        if packet.properties.subscription_identifiers:
            # We advertise Subscription Identifiers Available = 0; refuse every filter.
            codes = [ReasonCode.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED] * len(packet.subscriptions)
            self._send(mp.Suback(packet.packet_id, list(codes)))
            return
        reason_codes: list[int] = []
        retained_for: list[mp.Subscription] = []
        for requested in packet.subscriptions:
            topic_filter = requested.topic_filter
            if mp.is_shared_subscription(topic_filter):
                reason_codes.append(ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED)
                continue
            if not mp.is_valid_topic_filter(topic_filter):
                reason_codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                continue
            granted = replace(requested, qos=min(requested.qos, 1))
            existed = topic_filter in self.subscriptions
            self.subscriptions[topic_filter] = granted
            reason_codes.append(granted.qos)
            if granted.retain_handling == 0 or (granted.retain_handling == 1 and not existed):
                retained_for.append(granted)
        self._broker._routes.clear()
        self._send(mp.Suback(packet.packet_id, reason_codes))
        logger.debug("%s subscribed %s -> %s", self.client_id, packet.subscriptions, reason_codes)
        for subscription in retained_for:
            self._broker._send_retained(self, subscription)

    def _handle_unsubscribe(self, packet: mp.Unsubscribe) -> None:
        reason_codes: list[int] = []
        for topic_filter in packet.topic_filters:
            if self.subscriptions.pop(topic_filter, None) is not None:
                reason_codes.append(ReasonCode.SUCCESS)
            elif mp.is_valid_topic_filter(topic_filter):
                reason_codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
            else:
                reason_codes.append(ReasonCode.TOPIC_FILTER_INVALID)
        self._broker._routes.clear()
        self._send(mp.Unsuback(packet.packet_id, reason_codes))

    # ---- delivery ----------------------------------------------------------------------------

    def deliver(self, message: Message, qos: int, retain: bool, received_at: float) -> None:
        """Send ``message`` at ``qos``, or queue it while the receive window is full."""
        if self._ended:
            return
        if qos and (self._pending or len(self._inflight) >= self._receive_maximum):
            self._pending.append(_Pending(message, retain, received_at))
            return
        self._send_publish(message, qos, retain, received_at)

    def _send_publish(self, message: Message, qos: int, retain: bool, received_at: float) -> None:
        expiry = message.message_expiry_interval
        if expiry is not None:
            # Forward the time left, as the spec requires; drop what has expired meanwhile.
            expiry -= int(self._loop.time() - received_at)
            if expiry <= 0:
                logger.debug("%s: dropping expired message on %s", self.client_id, message.topic)
                return
        packet_id = self._allocate_packet_id() if qos else None
        data = mp.encode(
            mp.Publish(
                message.topic,
                message.payload,
                qos,
                retain,
                False,
                packet_id,
                mp.Properties(
                    payload_format_indicator=message.payload_format_indicator,
                    message_expiry_interval=expiry,
                    content_type=message.content_type,
                    response_topic=message.response_topic,
                    correlation_data=message.correlation_data,
                    user_properties=message.user_properties,
                ),
            )
        )
        if len(data) > self._client_max_packet_size:
            # The spec says to discard it as if delivered; the client could never accept it.
            logger.warning(
                "%s: dropping %d-byte message over its maximum packet size",
                self.client_id,
                len(data),
            )
            return
        if packet_id is not None:
            self._inflight.add(packet_id)
        self._write_raw(data)

    def _allocate_packet_id(self) -> int:
        # The window is at most 65535 wide, so a free id always exists when we get here.
        packet_id = self._next_packet_id
        while packet_id in self._inflight:
            packet_id = packet_id % 65_535 + 1
        self._next_packet_id = packet_id % 65_535 + 1
        return packet_id


def _message_from(
    topic: str, payload: bytes, qos: int, retain: bool, props: mp.Properties
) -> Message:
    return Message(
        topic=topic,
        payload=payload,
        qos=qos,
        retain=retain,
        response_topic=props.response_topic,
        correlation_data=props.correlation_data,
        content_type=props.content_type,
        message_expiry_interval=props.message_expiry_interval,
        payload_format_indicator=props.payload_format_indicator,
        user_properties=props.user_properties,
    )
