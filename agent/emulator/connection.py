"""One client of the embedded broker: its socket, its packets, its limits.

The broker (`broker.py`) routes between connections; everything about one client lives
here: TLS, CONNECT and authentication, keep-alive, authorization of each PUBLISH and
SUBSCRIBE, the receive window, and the bounds on what the client may cost (what waits to
be sent to it, how many of its packets are handled before the others get a turn).

What a connection needs of the broker is ``ConnectionHost`` (`host.py`): the broker is
above its connections, so this module never imports `broker.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from collections import deque
from dataclasses import dataclass, replace
from typing import Final

from agent.emulator import mqtt_packets as mp
from agent.emulator.authz import ClientIdentity
from agent.emulator.disconnects import DisconnectReason
from agent.emulator.host import ConnectionHost
from agent.emulator.mqtt_packets import ReasonCode
from agent.emulator.outbox import SHARED_FROM, Outbox
from agent.emulator.tls import subject_of
from agent.message import Message

logger = logging.getLogger("agent.emulator.broker")

_KEEPALIVE_GRACE: Final = 1.5  # the spec's "one and a half times the Keep Alive"
_DEFAULT_RECEIVE_MAXIMUM: Final = 65_535
# A 3.1.1 CONNACK with return code 0x01 (unacceptable protocol version), which 3.1.1 and
# 3.1 clients understand; an MQTT 5 CONNACK would be gibberish to them.
_MQTT311_CONNACK_BAD_PROTOCOL: Final = b"\x20\x02\x00\x01"
# The TLS errors of a client that does not speak TLS: its first bytes are not a TLS record.
_NOT_TLS: Final = frozenset({"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL"})
# What a queued message is counted as beyond its payload and topic (properties, header).
_QUEUED_OVERHEAD: Final = 64


@dataclass(slots=True)
class _Pending:
    """A QoS 1 delivery waiting for room in the subscriber's receive window."""

    message: Message
    retain: bool
    received_at: float
    size: int


class Connection(asyncio.Protocol):
    """One client socket: decodes packets, enforces the protocol, sends deliveries."""

    def __init__(self, broker: ConnectionHost[Connection]) -> None:
        self._broker = broker
        self._limits = broker.limits
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        # Until its CONNECT is accepted, a client may send only a CONNECT, and a small one.
        self._reader = mp.PacketReader(
            min(broker.limits.max_connect_size, broker.limits.max_packet_size)
        )
        self._held = 0  # bytes counted in the broker's hold_unauthenticated()
        self.peer = "?"
        self.client_id: str | None = None  # set once the CONNECT is accepted
        self.identity: ClientIdentity | None = None
        self.certificate_subject: str | None = None
        self.subscriptions: dict[str, mp.Subscription] = {}
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._ended = False
        self._tls_ready = broker.ssl_context is None
        self._will: Message | None = None
        self._keep_alive_s = 0
        self._last_packet_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._receive_maximum = _DEFAULT_RECEIVE_MAXIMUM  # the client's, for our QoS 1 sends
        self._client_max_packet_size = mp.MAX_PACKET_SIZE
        self._inflight: set[int] = set()
        self._pending: deque[_Pending] = deque()
        self._pending_bytes = 0
        self._next_packet_id = 1
        self._outbox = Outbox(self._loop)
        self._turn_scheduled = False  # packets left over for the next turn
        self.dropped = 0  # QoS 0 messages dropped because the client is not reading

    def __repr__(self) -> str:
        return f"<Connection {self.client_id or '(connecting)'} {self.peer}>"

    # ---- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peername = transport.get_extra_info("peername")
        self.peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        if not self._broker.admit(self):
            self._ended = True
            transport.abort()
            return
        self._transport = self._outbox.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._last_packet_at = self._loop.time()
        # Covers the TLS handshake and CONNECT together.
        self._timer = self._loop.call_later(self._limits.connect_timeout_s, self._on_timer)
        logger.debug("connection from %s", self.peer)
        if not self._tls_ready:
            transport.pause_reading()  # nothing is read before the handshake takes over
            self._loop.create_task(self._start_tls(transport))

    async def _start_tls(self, transport: asyncio.Transport) -> None:
        context = self._broker.ssl_context
        assert context is not None
        try:
            tls = await self._loop.start_tls(
                transport,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=self._limits.connect_timeout_s,
            )
        except (TimeoutError, OSError, ConnectionError) as error:
            self._tls_failed(transport, error)
            return
        except Exception as error:  # ssl.SSLError is an OSError; anything else is odd
            self._tls_failed(transport, error)
            return
        if tls is None or self._ended:
            if tls is not None:
                tls.abort()
            return
        self._transport = self._outbox.transport = tls
        self.certificate_subject = subject_of(tls.get_extra_info("peercert"))
        self._tls_ready = True
        logger.debug("TLS from %s, client certificate %s", self.peer, self.certificate_subject)
        self._take_turn()  # a CONNECT may have arrived with the end of the handshake

    def _tls_failed(self, transport: asyncio.Transport, error: BaseException) -> None:
        if not self._ended:
            if getattr(error, "reason", None) in _NOT_TLS:
                # What OpenSSL makes of a CONNECT's first bytes: not a TLS record at all.
                logger.warning(
                    "client at %s does not speak TLS on this TLS port (plain MQTT?): %s",
                    self.peer,
                    error,
                )
            else:
                logger.warning(
                    "TLS handshake from %s failed: %s",
                    self.peer,
                    str(error) or type(error).__name__,
                )
            self._transport = self._outbox.transport = None
            self.end(DisconnectReason.PROTOCOL_ERROR, None)
        transport.abort()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._ended:
            return
        self._reader.feed(data)
        if self._tls_ready:
            self._take_turn()
        # else the TLS layer handed over the CONNECT before start_tls() returned, that is
        # before the client certificate is known: it waits for _start_tls().
        if self.client_id is None:
            self._hold_unauthenticated()

    def _hold_unauthenticated(self) -> None:
        """Counts what this client, not yet connected, holds; refuses it past the bound."""
        held = 0 if self._ended or self.client_id is not None else self._reader.buffered
        if held == self._held:
            return
        if not self._broker.hold_unauthenticated(held - self._held):
            logger.warning(
                "closing connection from %s before CONNECT: clients not yet connected "
                "hold %d bytes or more (the most they may)",
                self.peer,
                self._limits.max_unauthenticated_bytes,
            )
            self._send(mp.Connack(ReasonCode.SERVER_BUSY))
            self.end(DisconnectReason.PROTOCOL_ERROR, None)
            return
        self._held = held

    def _take_turn(self) -> None:
        """Handles up to ``packets_per_turn`` packets, then lets other clients in."""
        self._turn_scheduled = False
        budget = self._limits.packets_per_turn
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
                if not budget:
                    # More may be buffered: read nothing more from this client until the
                    # others had their turn (a flood is served in turns, not all at once).
                    self._turn_scheduled = True
                    self._update_reading()
                    self._loop.call_soon(self._take_turn)
                    return
                packet = self._reader.next_packet()
                if packet is None:
                    break
                budget -= 1
                self._last_packet_at = self._loop.time()
                self._handle(packet)
        except mp.MalformedPacket as error:
            self._on_malformed(error)
        except Exception:
            logger.exception("internal error handling a packet from %r", self)
            self.end(DisconnectReason.PROTOCOL_ERROR, ReasonCode.UNSPECIFIED_ERROR)
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or self._ended or not self._tls_ready:
            return
        if self._turn_scheduled or self._outbox.blocked:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def pause_writing(self) -> None:
        # The client reads slower than we write: read nothing more from it either, so its
        # own requests cannot pile up answers (PUBACKs and all) in our write buffer.
        self._outbox.pause()
        self._update_reading()

    def resume_writing(self) -> None:
        self._outbox.resume()
        self._update_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._ended:
            self.end(DisconnectReason.DROPPED, None, publish_will=True)
        self._transport = self._outbox.transport = None
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
        if self._held:
            self._broker.hold_unauthenticated(-self._held)
            self._held = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if reason_code is not None and self.client_id is not None:
            self._send(mp.Disconnect(reason_code))
        self._close_transport()
        self._broker.release(self)
        client_id = self.client_id
        if client_id is None:
            logger.debug("connection from %s closed before CONNECT completed", self.peer)
            return
        self._broker.unregister(self, client_id)
        self.subscriptions.clear()
        self._pending.clear()
        self._pending_bytes = 0
        if publish_will is None:
            publish_will = reason is not DisconnectReason.SERVER_SHUTDOWN
        will = self._will if publish_will else None
        self._will = None
        logger.info("client %s disconnected (%s)", client_id, reason.value)
        self._broker.connection_ended(client_id, reason, will, self.identity)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _close_transport(self) -> None:
        self._outbox.close()

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
            logger.warning("closing connection from %s: no CONNECT in time", self.peer)
            self.end(DisconnectReason.PROTOCOL_ERROR, None)
            if self._transport is not None:
                self._transport.abort()
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

    def queued_bytes(self) -> int:
        """What waits to be sent to this client: held for its window, and our buffers."""
        return self._pending_bytes + self._outbox.queued_bytes()

    def _send(self, packet: mp.Packet) -> None:
        self._outbox.write(mp.encode(packet))

    def _write_raw(self, data: bytes) -> None:
        self._outbox.write(data)

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
            # QoS 2) and AUTH (K8S-SAT is one step; there is no re-authentication).
            self._protocol_error(
                ReasonCode.PROTOCOL_ERROR, f"unexpected {type(packet).__name__} packet"
            )

    def _refuse_connect(self, reason_code: int, why: str) -> None:
        logger.warning("refusing CONNECT from %s: %s (reason 0x%02x)", self.peer, why, reason_code)
        self._send(mp.Connack(reason_code))
        self.end(DisconnectReason.PROTOCOL_ERROR, None)

    def _handle_connect(self, packet: mp.Connect) -> None:
        props = packet.properties
        will = packet.will
        broker = self._broker
        if will is not None and will.qos > 1:
            self._refuse_connect(ReasonCode.QOS_NOT_SUPPORTED, "will QoS 2")
            return
        if will is not None and not mp.is_valid_topic_name(will.topic):
            self._refuse_connect(ReasonCode.TOPIC_NAME_INVALID, f"will topic {will.topic!r}")
            return
        will_response = None if will is None else will.properties.response_topic
        if will_response is not None and not mp.is_valid_topic_name(will_response):
            # As for a PUBLISH: nobody could ever answer on it.
            self._refuse_connect(
                ReasonCode.PROTOCOL_ERROR, f"invalid will response topic {will_response!r}"
            )
            return
        refusal = broker.authenticate(packet, self.certificate_subject)
        if refusal != ReasonCode.SUCCESS:
            who = f"client id {packet.client_id!r}"
            if packet.username is not None:
                who += f", user {packet.username!r}"
            if props.authentication_method is not None:
                who += f", method {props.authentication_method!r}"
            self._refuse_connect(refusal, f"authentication failed ({who})")
            return

        connack = mp.Properties(
            receive_maximum=broker.receive_maximum,
            maximum_qos=1,
            retain_available=1,
            maximum_packet_size=self._limits.max_packet_size,
            topic_alias_maximum=0,
            wildcard_subscription_available=1,
            subscription_identifier_available=0,
            shared_subscription_available=0,
            authentication_method=props.authentication_method,
        )
        if props.session_expiry_interval:
            connack.session_expiry_interval = 0  # no persistent sessions
        client_id = packet.client_id
        if not client_id:
            client_id = connack.assigned_client_identifier = f"auto-{uuid.uuid4().hex}"
        username = broker.principal_username(packet)
        if packet.username is not None and username is None:
            logger.info(
                "client %s: user name %r not proven by a password, not a principal",
                client_id,
                packet.username,
            )
        identity = ClientIdentity(client_id, username, self.certificate_subject)
        authorizer = broker.authorizer
        if authorizer is not None:
            if not authorizer.may_connect(identity):
                self._refuse_connect(ReasonCode.NOT_AUTHORIZED, f"no Connect grant for {identity}")
                return
            if will is not None and not authorizer.may_publish(identity, will.topic, will_response):
                self._refuse_connect(
                    ReasonCode.NOT_AUTHORIZED,
                    f"no Publish grant for the will topic {will.topic!r}"
                    f" (response topic {will_response!r})",
                )
                return
        keep_alive = packet.keep_alive
        if broker.max_keepalive_s and (keep_alive == 0 or keep_alive > broker.max_keepalive_s):
            keep_alive = connack.server_keep_alive = broker.max_keepalive_s
        self._keep_alive_s = keep_alive
        self._receive_maximum = props.receive_maximum or _DEFAULT_RECEIVE_MAXIMUM
        self._client_max_packet_size = props.maximum_packet_size or mp.MAX_PACKET_SIZE
        if will is not None:
            self._will = message_from(
                will.topic, will.payload, will.qos, will.retain, will.properties
            )

        broker.register(self, client_id)
        self.client_id = client_id
        self.identity = identity
        self._reader.max_packet_size = self._limits.max_packet_size
        if self._held:
            broker.hold_unauthenticated(-self._held)
            self._held = 0
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
        if props.response_topic is not None and not mp.is_valid_topic_name(props.response_topic):
            # [MQTT-3.3.2-14]: no wildcards; nobody could ever answer on it.
            self._protocol_error(
                ReasonCode.PROTOCOL_ERROR, f"invalid response topic {props.response_topic!r}"
            )
            return
        assert self.client_id is not None and self.identity is not None
        authorizer = self._broker.authorizer
        response_topic = props.response_topic
        if authorizer is not None and not authorizer.may_publish(
            self.identity, packet.topic, response_topic
        ):
            logger.info(
                "%s may not publish to %s (response topic %s)",
                self.client_id,
                packet.topic,
                response_topic,
            )
            if packet.packet_id is not None:
                self._send(mp.Puback(packet.packet_id, ReasonCode.NOT_AUTHORIZED))
            return
        message = message_from(packet.topic, packet.payload, packet.qos, packet.retain, props)
        self._broker.dispatch(message, sender=self, sender_id=self.client_id)
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
            self._pending_bytes -= pending.size
            self._send_publish(pending.message, 1, pending.retain, pending.received_at)

    def _handle_subscribe(self, packet: mp.Subscribe) -> None:
        if packet.properties.subscription_identifiers:
            # We advertise Subscription Identifiers Available = 0; refuse every filter.
            codes = [ReasonCode.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED] * len(packet.subscriptions)
            self._send(mp.Suback(packet.packet_id, list(codes)))
            return
        reason_codes: list[int] = []
        retained_for: list[mp.Subscription] = []
        authorizer = self._broker.authorizer
        assert self.identity is not None
        for requested in packet.subscriptions:
            topic_filter = requested.topic_filter
            if mp.is_shared_subscription(topic_filter):
                reason_codes.append(ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED)
                continue
            if not mp.is_valid_topic_filter(topic_filter):
                reason_codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                continue
            if authorizer is not None and not authorizer.may_subscribe(self.identity, topic_filter):
                logger.info("%s may not subscribe to %s", self.client_id, topic_filter)
                reason_codes.append(ReasonCode.NOT_AUTHORIZED)
                continue
            granted = replace(requested, qos=min(requested.qos, 1))
            existed = topic_filter in self.subscriptions
            self.subscriptions[topic_filter] = granted
            reason_codes.append(granted.qos)
            if granted.retain_handling == 0 or (granted.retain_handling == 1 and not existed):
                retained_for.append(granted)
        self._broker.subscriptions_changed()
        self._send(mp.Suback(packet.packet_id, reason_codes))
        logger.debug("%s subscribed %s -> %s", self.client_id, packet.subscriptions, reason_codes)
        for subscription in retained_for:
            self._broker.send_retained(self, subscription)

    def _handle_unsubscribe(self, packet: mp.Unsubscribe) -> None:
        reason_codes: list[int] = []
        for topic_filter in packet.topic_filters:
            if self.subscriptions.pop(topic_filter, None) is not None:
                reason_codes.append(ReasonCode.SUCCESS)
            elif mp.is_valid_topic_filter(topic_filter):
                reason_codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
            else:
                reason_codes.append(ReasonCode.TOPIC_FILTER_INVALID)
        self._broker.subscriptions_changed()
        self._send(mp.Unsuback(packet.packet_id, reason_codes))

    # ---- delivery ----------------------------------------------------------------------------

    def deliver(self, message: Message, qos: int, retain: bool, received_at: float) -> None:
        """Send ``message`` at ``qos``, queue it while the receive window is full, or, when
        more than ``max_queued_bytes`` already wait for this client, drop it (QoS 0) or end
        the connection (QoS 1): a client that does not keep up must not cost unbounded memory.
        """
        if self._ended:
            return
        if self.queued_bytes() > self._limits.max_queued_bytes:
            if qos:
                logger.warning(
                    "client %s does not keep up: %d bytes wait for it; disconnecting",
                    self.client_id,
                    self.queued_bytes(),
                )
                self.end(DisconnectReason.SLOW_CONSUMER, ReasonCode.QUOTA_EXCEEDED)
                return
            if not self.dropped % 1000:
                logger.warning(
                    "client %s does not keep up: dropping QoS 0 messages (%d so far)",
                    self.client_id,
                    self.dropped + 1,
                )
            self.dropped += 1
            return
        if qos and (self._pending or len(self._inflight) >= self._receive_maximum):
            size = len(message.payload) + len(message.topic) + _QUEUED_OVERHEAD
            self._pending.append(_Pending(message, retain, received_at, size))
            self._pending_bytes += size
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
        packet = mp.Publish(
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
        # A big payload is written from the message's own bytes, shared with every other
        # client it goes to; a small one is joined to its head.
        shared = len(message.payload) >= SHARED_FROM
        data = mp.encode_publish_head(packet) if shared else mp.encode(packet)
        size = len(data) + len(message.payload) if shared else len(data)
        if size > self._client_max_packet_size:
            # The spec says to discard it as if delivered; the client could never accept it.
            logger.warning(
                "%s: dropping %d-byte message over its maximum packet size",
                self.client_id,
                size,
            )
            return
        if packet_id is not None:
            self._inflight.add(packet_id)
        if shared:
            self._outbox.write_shared(data, message.payload)
        else:
            self._outbox.write(data)

    def _allocate_packet_id(self) -> int:
        # The window is at most 65535 wide, so a free id always exists when we get here.
        packet_id = self._next_packet_id
        while packet_id in self._inflight:
            packet_id = packet_id % 65_535 + 1
        self._next_packet_id = packet_id % 65_535 + 1
        return packet_id


def message_from(
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
