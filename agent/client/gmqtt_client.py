"""The one module that imports gmqtt: a gmqtt 0.8 client as the session needs it.

Everything that reaches into gmqtt's private internals is here, so that a gmqtt upgrade is
checked in one place (gmqtt is pinned to 0.8.x):

- gmqtt reconnects by itself with a fixed delay and, on a CONNACK refusing MQTT 5, silently
  downgrades to 3.1.1: ``reconnect()`` is overridden to do neither (the session reconnects).
- gmqtt ignores the PUBACK reason code and has no PUBACK callback: the package handler's
  ``_handle_puback_packet`` is wrapped.
- gmqtt's ``publish()`` does not return the packet id: ``_connection.publish`` is called.
- Dropping the TCP connection at once needs ``_connection._transport``.
- The dead-link watchdog (``link``) reads when the connection last received anything
  (``_connection._last_data_in``) and sends PINGREQs with ``_connection._send_ping_request``.
- The exception a connection ends with (a TLS alert) is only logged by gmqtt: the protocol's
  ``connection_lost`` is wrapped in ``_create_connection`` to report it, and gmqtt's own
  log line of it (a traceback) is filtered out; so are its lines about a CONNACK refusal,
  which the session reports (``connack_error``) in the words of the settings to check.
- A refused CONNACK comes as ``MQTTConnectError`` whose code is in ``_code``.
- A transport closed before gmqtt has made its connection of it (an attempt cancelled
  between TCP's connect and the return of ``create_connection``: a stop while connecting)
  makes gmqtt's protocol raise from the event loop's callbacks: ``_Protocol`` is gmqtt's
  protocol with that case handled, put in gmqtt's connection module for it to build.
- gmqtt's property table lacks Authentication Data (0x16), which K8S-SAT authentication needs
  in CONNECT: ``_register_authentication_data()`` adds it (see there for the way upstream).

The session sees typed callbacks (``on_connack(receive_maximum, subscription_ids)``,
``on_message(Message, identifiers)``, ``on_ack(packet_id, result)``, ``on_lost(reason)``)
and this project's ``Message``, never gmqtt's property dictionaries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from collections.abc import Callable
from typing import Any, TypeAlias

import gmqtt  # type: ignore[import-untyped]
from gmqtt.mqtt import connection as gmqtt_connection  # type: ignore[import-untyped]
from gmqtt.mqtt.constants import MQTTv50  # type: ignore[import-untyped]
from gmqtt.mqtt.handler import MQTTConnectError  # type: ignore[import-untyped]
from gmqtt.mqtt.property import (  # type: ignore[import-untyped]
    PROPERTIES,
    PROPERTIES_BY_ID,
    PROPERTIES_BY_NAME,
    Property,
)
from gmqtt.mqtt.protocol import BaseMQTTProtocol, MQTTProtocol  # type: ignore[import-untyped]

from agent.client.credentials import Credentials
from agent.client.session_errors import SettingNames, connack_error, own_names
from agent.message import Message

__all__ = ["GmqttClient", "OutgoingMessage", "outgoing"]

AUTHENTICATION_DATA = 0x16


def _register_authentication_data() -> None:
    """Teach gmqtt the Authentication Data property (0x16, Binary Data), as ``auth_data``.

    gmqtt 0.8 knows Authentication Method (``auth_method``, 0x15) but not its data, so it would
    drop ``auth_data=`` from CONNECT with a warning, and disconnect on a CONNACK or AUTH that
    carries it ("invalid property id"). Its encoder and decoder find properties by name and id
    in two module-level tables; adding the entry to both is all it takes, and it changes
    nothing for a client that does not use it.

    Upstream, this is one line in ``PROPERTIES`` of ``gmqtt/mqtt/property.py``:
    ``Property(22, 'b', 'auth_data', ['CONNECT', 'CONNACK', 'AUTH'])``, with a test that a
    CONNECT built with ``auth_method=...`` and ``auth_data=...`` carries both. Multi-step
    methods (SCRAM and the like) would also need gmqtt to handle AUTH packets (0xF0), which it
    ignores today; K8S-SAT is a single step, CONNECT then CONNACK. Once a gmqtt release has the
    entry, this function finds it there and does nothing.
    """
    if AUTHENTICATION_DATA in PROPERTIES_BY_ID:
        return
    entry = Property(AUTHENTICATION_DATA, "b", "auth_data", ["CONNECT", "CONNACK", "AUTH"])
    PROPERTIES.append(entry)
    PROPERTIES_BY_ID[AUTHENTICATION_DATA] = entry
    PROPERTIES_BY_NAME[entry.name] = entry


_register_authentication_data()


class _Protocol(MQTTProtocol):  # type: ignore[misc]
    """gmqtt's protocol, quiet when its transport closes before gmqtt made a connection of
    it: gmqtt's own tells that connection (None then: AttributeError in a loop callback),
    and its read loop, left running, fails on the transport it no longer has."""

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._connection is not None:
            super().connection_lost(exc)
            return
        reading: asyncio.Future[None] | None = getattr(self, "_read_loop_future", None)
        if reading is not None:
            reading.cancel()
            self._read_loop_future = None
        BaseMQTTProtocol.connection_lost(self, exc)


gmqtt_connection.MQTTProtocol = _Protocol


class _ReportedBySession(logging.Filter):
    """gmqtt logs events the session reports itself, once and in an operator's words: the
    exception each connection ends with (a traceback, at WARNING; the session has its reason
    from ``on_transport_error``) and a CONNACK refusal (three lines, up to ERROR, before the
    session's own; the session names the settings to check). Only these lines are dropped:
    anything else gmqtt says still shows."""

    def __init__(self, *starts: str) -> None:
        super().__init__()
        self._starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self._starts)


logging.getLogger("gmqtt.mqtt.protocol").addFilter(_ReportedBySession("[EXC: CONN LOST]"))
logging.getLogger("gmqtt.mqtt.handler").addFilter(
    _ReportedBySession(
        "[MqttPackageHandler] CONNACK",  # "CONNACK: 0x86", "CONNACK 0x86 is permanent, ..."
        "[MqttPackageHandler] not reconnecting after a permanent CONNACK refusal",
    )
)


class GmqttClient(gmqtt.Client):  # type: ignore[misc]
    """One connection's gmqtt client: no reconnect of its own, typed callbacks."""

    def __init__(
        self,
        client_id: str,
        *,
        credentials: Credentials,
        on_connack: Callable[[int, bool], None],
        on_message: Callable[[Message, list[int]], None],
        on_undecodable: Callable[[], None],
        on_ack: Callable[[int, Any], None],
        on_lost: Callable[[int | None], None],
        on_downgrade: Callable[[], None],
        on_transport_error: Callable[[BaseException], None] = lambda exc: None,
        will: Message | None = None,
        names: SettingNames = own_names,
    ) -> None:
        connect_properties: dict[str, Any] = {}
        if credentials.auth_method is not None:
            connect_properties["auth_method"] = credentials.auth_method
            if credentials.auth_data is not None:
                connect_properties["auth_data"] = credentials.auth_data
        super().__init__(client_id, will_message=_will_message(will), **connect_properties)
        self._token_auth = credentials.auth_method is not None
        self._names = names
        if credentials.username is not None:
            self.set_auth_credentials(credentials.username, credentials.password)
        self._on_downgrade = on_downgrade
        self._on_transport_error = on_transport_error
        self.transport_up = False  # TCP (and the TLS handshake) done: CONNECT is under way
        self.on_connect = _connack_callback(on_connack)
        self.on_message = _message_callback(on_message, on_undecodable)
        self.on_disconnect = _disconnect_callback(on_lost)
        self.on_subscribe = _suback_callback(on_ack)
        self.on_unsubscribe = _suback_callback(on_ack)

        handler = self._package_handler
        original = handler._handle_puback_packet

        def handle_puback(cmd: int, packet: bytes) -> None:
            original(cmd, packet)  # frees the packet id
            (mid,) = struct.unpack("!H", packet[:2])
            # MQTT 5 §3.4.2.1: no reason code byte means 0x00 (success).
            on_ack(mid, packet[2] if len(packet) > 2 else 0)

        # gmqtt's handler looks its per-packet methods up by name, so an instance attribute
        # takes precedence.
        handler._handle_puback_packet = handle_puback

    async def open(
        self, host: str, port: int, *, ssl_context: ssl.SSLContext | None, keepalive: int
    ) -> None:
        """TCP, TLS, CONNECT and a successful CONNACK; raises ConnectionRefused on a refusal."""
        try:
            await self.connect(
                host, port, ssl=ssl_context or False, keepalive=keepalive, version=MQTTv50,
                raise_exc=True,
            )  # fmt: skip
        except MQTTConnectError as exc:
            code = int(getattr(exc, "_code", 0x80))
            raise connack_error(code, token_auth=self._token_auth, names=self._names) from None

    async def _create_connection(
        self, host: str, port: int, ssl: Any, clean_session: bool, keepalive: int
    ) -> Any:
        connection = await super()._create_connection(
            host, port=port, ssl=ssl, clean_session=clean_session, keepalive=keepalive
        )
        self.transport_up = True
        # gmqtt logs the exception a connection ends with, and tells nobody. It is the only
        # sign of a TLS alert that comes after the handshake (TLS 1.3: the broker refusing
        # our client certificate), so pass it on.
        protocol = connection._protocol
        original = protocol.connection_lost
        report = self._on_transport_error

        def connection_lost(exc: BaseException | None) -> None:
            if exc is not None:
                report(exc)
            original(exc)

        protocol.connection_lost = connection_lost
        return connection

    async def reconnect(self, delay: bool = False) -> None:
        # gmqtt calls this after a lost connection and after a refused CONNACK; the session
        # reconnects instead. On CONNACK "unacceptable protocol version" to an MQTT 5 CONNECT,
        # gmqtt has just switched itself to 3.1.1 and calls this to reconnect with it: refuse.
        if self.downgraded:
            self._on_downgrade()

    @property
    def downgraded(self) -> bool:
        """Whether gmqtt switched itself to MQTT 3.1.1 after a CONNACK refusing MQTT 5."""
        return bool(self._connection_state.protocol_version != MQTTv50)

    def publish_mid(self, message: OutgoingMessage) -> int | None:
        """Send a PUBLISH made by ``outgoing()``; return its packet id (None for QoS 0)."""
        mid, _ = self._connection.publish(message)
        return mid  # type: ignore[no-any-return]

    def subscribe_mid(self, topic_filter: str, qos: int, identifier: int | None) -> int:
        """Send a SUBSCRIBE (with a subscription identifier, if given); return its packet id."""
        extra = {"subscription_identifier": identifier} if identifier is not None else {}
        return int(self.subscribe(topic_filter, qos=qos, **extra))

    def unsubscribe_mid(self, topic_filter: str) -> int:
        return int(self.unsubscribe(topic_filter))

    @property
    def keepalive(self) -> float:
        """The keep-alive in force: ours, or the broker's Server Keep Alive from CONNACK."""
        connection = self._connection
        return float(connection.keepalive) if connection is not None else 0.0

    @property
    def last_heard(self) -> float:
        """When (time.monotonic()) the connection last received a packet."""
        return float(self._connection._last_data_in)

    def ping(self) -> None:
        """Send a PINGREQ."""
        connection = self._connection
        if connection is not None and not connection.is_closing():
            connection._send_ping_request()

    def abort(self) -> None:
        """Drop the TCP connection at once (no DISCONNECT, no TLS close_notify), with a reset:
        what was sent and not yet acknowledged by the peer's TCP is discarded, not
        retransmitted, so a link that heals later cannot deliver a request we gave up on
        (a write fenced with a lease that has ended)."""
        connection = self._connection
        if connection is not None and not connection.is_closing():
            transport = connection._transport
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):  # linger 0: close sends RST
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()


# A message ready to send: built once per publish() by outgoing(), sent by publish_mid() (a
# gmqtt.Message; the session does not look inside).
OutgoingMessage: TypeAlias = Any


def outgoing(
    topic: str,
    payload: bytes,
    *,
    qos: int,
    retain: bool,
    response_topic: str | None,
    correlation_data: bytes | None,
    content_type: str | None,
    message_expiry_interval: int | None,
    user_properties: list[tuple[str, str]],
) -> OutgoingMessage:
    properties: dict[str, Any] = {}
    if response_topic is not None:
        properties["response_topic"] = response_topic
    if correlation_data is not None:
        properties["correlation_data"] = correlation_data
    if content_type is not None:
        properties["content_type"] = content_type
    if message_expiry_interval is not None:
        properties["message_expiry_interval"] = message_expiry_interval
    if user_properties:
        properties["user_property"] = user_properties
    return gmqtt.Message(topic, payload, qos=qos, retain=retain, **properties)


def _will_message(will: Message | None) -> OutgoingMessage | None:
    """The Last Will as gmqtt sends it in CONNECT (its properties: content type, expiry)."""
    if will is None:
        return None
    return outgoing(
        will.topic,
        will.payload,
        qos=will.qos,
        retain=will.retain,
        response_topic=None,
        correlation_data=None,
        content_type=will.content_type,
        message_expiry_interval=will.message_expiry_interval,
        user_properties=list(will.user_properties),
    )


# --- gmqtt's callbacks, turned into the session's --------------------------------------------
# gmqtt hands properties over as a dict of lists (a property may appear more than once).


def _first(props: dict[str, Any], name: str) -> Any:
    values = props.get(name)
    return values[0] if isinstance(values, list) and values else None


def _connack_callback(on_connack: Callable[[int, bool], None]) -> Callable[..., None]:
    def on_connect(_client: Any, _flags: int, _rc: int, props: Any) -> None:
        # Only called for a successful CONNACK.
        props = props if isinstance(props, dict) else {}
        receive_maximum = _first(props, "receive_maximum")
        available = props.get("sub_id_available")
        on_connack(
            receive_maximum if isinstance(receive_maximum, int) else 65535,
            not (isinstance(available, list) and available == [0]),
        )

    return on_connect


def _message_callback(
    on_message: Callable[[Message, list[int]], None], on_undecodable: Callable[[], None]
) -> Callable[..., None]:
    def deliver(_client: Any, topic: Any, payload: bytes, qos: int, props: Any) -> None:
        if not isinstance(topic, str):
            on_undecodable()
            return
        correlation = _first(props, "correlation_data")
        message = Message(
            topic=topic,
            payload=bytes(payload),
            qos=qos,
            retain=bool(props.get("retain")),
            response_topic=_first(props, "response_topic"),
            correlation_data=bytes(correlation) if correlation is not None else None,
            content_type=_first(props, "content_type"),
            message_expiry_interval=_first(props, "message_expiry_interval"),
            user_properties=[(str(k), str(v)) for k, v in props.get("user_property", [])],
        )
        on_message(message, props.get("subscription_identifier") or [])

    return deliver


def _disconnect_callback(on_lost: Callable[[int | None], None]) -> Callable[..., None]:
    def on_disconnect(_client: Any, packet: Any = None, *_: Any) -> None:
        # A DISCONNECT from the broker carries a reason code; the one gmqtt synthesises when
        # the socket closes is empty.
        on_lost(packet[0] if isinstance(packet, bytes | bytearray) and packet else None)

    return on_disconnect


def _suback_callback(on_ack: Callable[[int, Any], None]) -> Callable[..., None]:
    def on_suback(_client: Any, mid: int, codes: Any, *_: Any) -> None:
        on_ack(mid, list(codes))

    return on_suback
