"""A pure MQTT 5 packet codec: bytes in, dataclasses out, and back. No I/O, no asyncio.

``PacketReader`` is incremental in the style of h11: ``feed()`` it whatever arrived on the
wire and pull complete packets with ``next_packet()`` (or iterate it). Every malformed input
raises ``MalformedPacket`` carrying the MQTT 5 reason code a server would put in its
DISCONNECT (or CONNACK). ``encode()`` turns a packet back into bytes.

The codec checks what can be checked from the bytes alone (structure, reserved bits, property
placement and values, UTF-8 strings). Session rules (what a server supports, topic aliases,
which packets a client may send) belong to the caller. Topic name/filter validation and
matching come from ``agent.protocol.mqtt_topics``, shared with the client session.

Reference: MQTT Version 5.0, OASIS Standard, 7 March 2019.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Final, TypeAlias

from agent.protocol.mqtt_topics import is_shared_subscription as is_shared_subscription
from agent.protocol.mqtt_topics import is_valid_topic_filter as is_valid_topic_filter
from agent.protocol.mqtt_topics import is_valid_topic_name as is_valid_topic_name
from agent.protocol.mqtt_topics import topic_matches as topic_matches

# Largest remaining length a variable byte integer can hold, and the largest whole packet.
MAX_REMAINING_LENGTH: Final = 268_435_455
MAX_PACKET_SIZE: Final = 1 + 4 + MAX_REMAINING_LENGTH
_MAX_STRING_BYTES: Final = 65_535


class PacketType(enum.IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class ReasonCode(enum.IntEnum):
    """MQTT 5 reason codes (section 2.4). Several names share a value, as in the spec."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class MalformedPacket(Exception):
    """The byte stream is not valid MQTT 5; the connection cannot continue.

    ``reason_code`` is what to send in DISCONNECT (or CONNACK): usually 0x81 Malformed Packet,
    0x82 Protocol Error, or 0x95 Packet Too Large. ``packet_type`` is the type from the fixed
    header when it was readable, so a server can tell a bad CONNECT from anything else.
    """

    def __init__(
        self, reason_code: int, message: str, packet_type: PacketType | None = None
    ) -> None:
        super().__init__(message)
        self.reason_code = reason_code
        self.packet_type = packet_type


class UnsupportedProtocolVersion(MalformedPacket):
    """A CONNECT for another protocol version (e.g. 3.1.1); ``protocol_level`` says which."""

    def __init__(self, protocol_level: int, protocol_name: str) -> None:
        super().__init__(
            ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
            f"unsupported protocol {protocol_name!r} level {protocol_level}",
            PacketType.CONNECT,
        )
        self.protocol_level = protocol_level


# --------------------------------------------------------------------------------------------
# Properties


class _Kind(enum.Enum):
    BYTE = 1
    UINT16 = 2
    UINT32 = 3
    VARINT = 4
    STRING = 5
    BINARY = 6
    STRING_PAIR = 7


@dataclass(slots=True)
class Properties:
    """All MQTT 5 properties; ``None`` (or an empty list) means absent.

    User properties are an ordered list of (name, value) pairs; duplicates are kept, as the
    spec requires. A PUBLISH sent by a server may carry several subscription identifiers.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: list[int] = field(default_factory=list)
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None


SUBSCRIPTION_IDENTIFIER: Final = 0x0B
USER_PROPERTY: Final = 0x26

# Property identifier -> (Properties attribute, wire type), in identifier order so encoding is
# deterministic. The two list-valued properties are handled separately.
PROPERTY_TABLE: Final[dict[int, tuple[str, _Kind]]] = {
    0x01: ("payload_format_indicator", _Kind.BYTE),
    0x02: ("message_expiry_interval", _Kind.UINT32),
    0x03: ("content_type", _Kind.STRING),
    0x08: ("response_topic", _Kind.STRING),
    0x09: ("correlation_data", _Kind.BINARY),
    SUBSCRIPTION_IDENTIFIER: ("subscription_identifiers", _Kind.VARINT),
    0x11: ("session_expiry_interval", _Kind.UINT32),
    0x12: ("assigned_client_identifier", _Kind.STRING),
    0x13: ("server_keep_alive", _Kind.UINT16),
    0x15: ("authentication_method", _Kind.STRING),
    0x16: ("authentication_data", _Kind.BINARY),
    0x17: ("request_problem_information", _Kind.BYTE),
    0x18: ("will_delay_interval", _Kind.UINT32),
    0x19: ("request_response_information", _Kind.BYTE),
    0x1A: ("response_information", _Kind.STRING),
    0x1C: ("server_reference", _Kind.STRING),
    0x1F: ("reason_string", _Kind.STRING),
    0x21: ("receive_maximum", _Kind.UINT16),
    0x22: ("topic_alias_maximum", _Kind.UINT16),
    0x23: ("topic_alias", _Kind.UINT16),
    0x24: ("maximum_qos", _Kind.BYTE),
    0x25: ("retain_available", _Kind.BYTE),
    USER_PROPERTY: ("user_properties", _Kind.STRING_PAIR),
    0x27: ("maximum_packet_size", _Kind.UINT32),
    0x28: ("wildcard_subscription_available", _Kind.BYTE),
    0x29: ("subscription_identifier_available", _Kind.BYTE),
    0x2A: ("shared_subscription_available", _Kind.BYTE),
}
_SCALAR_PROPERTIES: Final = tuple(
    (pid, name, kind)
    for pid, (name, kind) in PROPERTY_TABLE.items()
    if pid not in (SUBSCRIPTION_IDENTIFIER, USER_PROPERTY)
)

# Which properties each packet may carry (spec section 3.x.2.2). WILL is the will-properties
# block inside CONNECT, keyed by a sentinel outside the packet type range.
WILL_PROPERTIES: Final = 0
_ACK_PROPERTIES: Final = frozenset({0x1F, USER_PROPERTY})
ALLOWED_PROPERTIES: Final[dict[int, frozenset[int]]] = {
    PacketType.CONNECT: frozenset({0x11, 0x21, 0x27, 0x22, 0x19, 0x17, USER_PROPERTY, 0x15, 0x16}),
    WILL_PROPERTIES: frozenset({0x18, 0x01, 0x02, 0x03, 0x08, 0x09, USER_PROPERTY}),
    PacketType.CONNACK: frozenset(
        {0x11, 0x21, 0x24, 0x25, 0x27, 0x12, 0x22, 0x1F, USER_PROPERTY}
        | {0x28, 0x29, 0x2A, 0x13, 0x1A, 0x1C, 0x15, 0x16}
    ),
    PacketType.PUBLISH: frozenset(
        {0x01, 0x02, 0x23, 0x08, 0x09, USER_PROPERTY, SUBSCRIPTION_IDENTIFIER, 0x03}
    ),
    PacketType.PUBACK: _ACK_PROPERTIES,
    PacketType.PUBREC: _ACK_PROPERTIES,
    PacketType.PUBREL: _ACK_PROPERTIES,
    PacketType.PUBCOMP: _ACK_PROPERTIES,
    PacketType.SUBSCRIBE: frozenset({SUBSCRIPTION_IDENTIFIER, USER_PROPERTY}),
    PacketType.SUBACK: _ACK_PROPERTIES,
    PacketType.UNSUBSCRIBE: frozenset({USER_PROPERTY}),
    PacketType.UNSUBACK: _ACK_PROPERTIES,
    PacketType.DISCONNECT: frozenset({0x11, 0x1F, USER_PROPERTY, 0x1C}),
    PacketType.AUTH: frozenset({0x15, 0x16, 0x1F, USER_PROPERTY}),
}

_BOOLEAN_PROPERTIES: Final = frozenset({0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A})
_NONZERO_PROPERTIES: Final = frozenset({0x21, 0x23, 0x27})
_MAX_SUBSCRIPTION_IDENTIFIER: Final = MAX_REMAINING_LENGTH


# --------------------------------------------------------------------------------------------
# Packets


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Connect:
    client_id: str
    clean_start: bool = True
    keep_alive: int = 0
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Connack:
    reason_code: int = ReasonCode.SUCCESS
    session_present: bool = False
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None  # present exactly when qos > 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class _Acknowledgement:
    """The shape shared by PUBACK, PUBREC, PUBREL and PUBCOMP."""

    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


class Puback(_Acknowledgement):
    __slots__ = ()


class Pubrec(_Acknowledgement):
    __slots__ = ()


class Pubrel(_Acknowledgement):
    __slots__ = ()


class Pubcomp(_Acknowledgement):
    __slots__ = ()


@dataclass(slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE with its subscription options."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    subscriptions: list[Subscription]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class _ReasonCodes:
    """The shape shared by SUBACK and UNSUBACK: one reason code per topic filter."""

    packet_id: int
    reason_codes: list[int]
    properties: Properties = field(default_factory=Properties)


class Suback(_ReasonCodes):
    __slots__ = ()


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=Properties)


class Unsuback(_ReasonCodes):
    __slots__ = ()


@dataclass(slots=True)
class Pingreq:
    pass


@dataclass(slots=True)
class Pingresp:
    pass


@dataclass(slots=True)
class Disconnect:
    reason_code: int = ReasonCode.NORMAL_DISCONNECTION
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Auth:
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


Packet: TypeAlias = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)


# --------------------------------------------------------------------------------------------
# Decoding


class _Cursor:
    """Reads MQTT data types from one packet body; running off the end is malformed."""

    __slots__ = ("data", "packet_type", "pos")

    def __init__(self, data: bytes, packet_type: PacketType) -> None:
        self.data = data
        self.pos = 0
        self.packet_type = packet_type

    def fail(self, reason_code: int, message: str) -> MalformedPacket:
        return MalformedPacket(reason_code, message, self.packet_type)

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, count: int) -> bytes:
        end = self.pos + count
        if end > len(self.data):
            raise self.fail(ReasonCode.MALFORMED_PACKET, "packet ends inside a field")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise self.fail(ReasonCode.MALFORMED_PACKET, "packet ends inside a field")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def uint16(self) -> int:
        pos = self.pos
        if pos + 2 > len(self.data):
            raise self.fail(ReasonCode.MALFORMED_PACKET, "packet ends inside a field")
        self.pos = pos + 2
        return self.data[pos] << 8 | self.data[pos + 1]

    def uint32(self) -> int:
        return int.from_bytes(self.take(4), "big")

    def varint(self) -> int:
        pos = self.pos
        if pos < len(self.data) and self.data[pos] < 0x80:  # one byte: nearly always
            self.pos = pos + 1
            return self.data[pos]
        value = 0
        for shift in (0, 7, 14, 21):
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if byte == 0 and shift:
                    raise self.fail(ReasonCode.MALFORMED_PACKET, "non-minimal variable integer")
                return value
        raise self.fail(ReasonCode.MALFORMED_PACKET, "variable byte integer over 4 bytes")

    def binary(self) -> bytes:
        # take(uint16()) inlined: every string and binary field goes through here.
        data = self.data
        start = self.pos + 2
        if start > len(data):
            raise self.fail(ReasonCode.MALFORMED_PACKET, "packet ends inside a field")
        end = start + (data[start - 2] << 8 | data[start - 1])
        if end > len(data):
            raise self.fail(ReasonCode.MALFORMED_PACKET, "packet ends inside a field")
        self.pos = end
        return data[start:end]

    def string(self) -> str:
        # binary() inlined: strings are most of the fields of a PUBLISH.
        data = self.data
        start = self.pos + 2
        if start > len(data):
            raise self.fail(ReasonCode.MALFORMED_PACKET, "packet ends inside a field")
        end = start + (data[start - 2] << 8 | data[start - 1])
        if end > len(data):
            raise self.fail(ReasonCode.MALFORMED_PACKET, "packet ends inside a field")
        self.pos = end
        try:
            text = data[start:end].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(ReasonCode.MALFORMED_PACKET, "string is not valid UTF-8") from None
        if "\x00" in text:
            raise self.fail(ReasonCode.MALFORMED_PACKET, "string contains U+0000")
        return text

    def packet_id(self) -> int:
        packet_id = self.uint16()
        if packet_id == 0:
            raise self.fail(ReasonCode.PROTOCOL_ERROR, "packet identifier 0")
        return packet_id

    def properties(self, allowed_key: int) -> Properties:
        length = self.varint()
        end = self.pos + length
        if end > len(self.data):
            raise self.fail(ReasonCode.MALFORMED_PACKET, "properties run past the packet")
        props = Properties()
        if not length:
            return props
        allowed = ALLOWED_PROPERTIES[allowed_key]
        seen: set[int] = set()
        varint = self.varint
        string = self.string
        while self.pos < end:
            pid = varint()
            entry = PROPERTY_TABLE.get(pid)
            if entry is None:
                raise self.fail(ReasonCode.MALFORMED_PACKET, f"unknown property 0x{pid:02x}")
            if pid not in allowed:
                raise self.fail(ReasonCode.PROTOCOL_ERROR, f"property {entry[0]} not allowed here")
            name, kind = entry
            if pid == USER_PROPERTY:
                props.user_properties.append((string(), string()))
            elif pid == SUBSCRIPTION_IDENTIFIER:
                value = self.varint()
                if value == 0:
                    raise self.fail(ReasonCode.PROTOCOL_ERROR, "subscription identifier 0")
                if props.subscription_identifiers and self.packet_type != PacketType.PUBLISH:
                    raise self.fail(ReasonCode.PROTOCOL_ERROR, "repeated subscription identifier")
                props.subscription_identifiers.append(value)
            else:
                if pid in seen:
                    raise self.fail(ReasonCode.PROTOCOL_ERROR, f"property {name} repeated")
                seen.add(pid)
                setattr(props, name, self._property_value(pid, kind))
        if self.pos != end:
            raise self.fail(ReasonCode.MALFORMED_PACKET, "property runs past the property block")
        if props.authentication_data is not None and props.authentication_method is None:
            raise self.fail(ReasonCode.PROTOCOL_ERROR, "authentication data without method")
        return props

    def _property_value(self, pid: int, kind: _Kind) -> int | str | bytes:
        if kind is _Kind.STRING:
            return self.string()
        if kind is _Kind.BINARY:
            return self.binary()
        if kind is _Kind.BYTE:
            number = self.byte()
        elif kind is _Kind.UINT16:
            number = self.uint16()
        else:
            number = self.uint32()
        if pid in _BOOLEAN_PROPERTIES and number > 1:
            raise self.fail(ReasonCode.PROTOCOL_ERROR, f"property 0x{pid:02x} must be 0 or 1")
        if pid in _NONZERO_PROPERTIES and number == 0:
            raise self.fail(ReasonCode.PROTOCOL_ERROR, f"property 0x{pid:02x} must not be 0")
        return number

    def expect_end(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(ReasonCode.MALFORMED_PACKET, "trailing bytes after packet")


def _decode_connect(cur: _Cursor) -> Connect:
    protocol_name = cur.string()
    level = cur.byte()
    if protocol_name != "MQTT" or level != 5:
        # Checked before anything else: older versions lay out the rest differently.
        raise UnsupportedProtocolVersion(level, protocol_name)
    flags = cur.byte()
    if flags & 0x01:
        raise cur.fail(ReasonCode.MALFORMED_PACKET, "reserved CONNECT flag set")
    has_will = bool(flags & 0x04)
    will_qos = (flags >> 3) & 0x03
    will_retain = bool(flags & 0x20)
    if not has_will and (will_qos or will_retain):
        raise cur.fail(ReasonCode.MALFORMED_PACKET, "will QoS/retain without a will")
    if will_qos == 3:
        raise cur.fail(ReasonCode.MALFORMED_PACKET, "will QoS 3")
    keep_alive = cur.uint16()
    properties = cur.properties(PacketType.CONNECT)
    client_id = cur.string()
    will = None
    if has_will:
        will_properties = cur.properties(WILL_PROPERTIES)
        will_topic = cur.string()
        will_payload = cur.binary()
        will = Will(will_topic, will_payload, will_qos, will_retain, will_properties)
    username = cur.string() if flags & 0x80 else None
    password = cur.binary() if flags & 0x40 else None
    cur.expect_end()
    return Connect(
        client_id=client_id,
        clean_start=bool(flags & 0x02),
        keep_alive=keep_alive,
        username=username,
        password=password,
        will=will,
        properties=properties,
    )


def _decode_connack(cur: _Cursor) -> Connack:
    ack_flags = cur.byte()
    if ack_flags & 0xFE:
        raise cur.fail(ReasonCode.MALFORMED_PACKET, "reserved CONNACK flag set")
    reason_code = cur.byte()
    properties = cur.properties(PacketType.CONNACK)
    cur.expect_end()
    return Connack(reason_code, bool(ack_flags & 0x01), properties)


def _decode_publish(cur: _Cursor, flags: int) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise cur.fail(ReasonCode.MALFORMED_PACKET, "PUBLISH QoS 3")
    dup = bool(flags & 0x08)
    if dup and not qos:
        raise cur.fail(ReasonCode.PROTOCOL_ERROR, "DUP set on a QoS 0 PUBLISH")
    topic = cur.string()
    packet_id = cur.packet_id() if qos else None
    properties = cur.properties(PacketType.PUBLISH)
    payload = cur.data[cur.pos :]
    return Publish(topic, payload, qos, bool(flags & 0x01), dup, packet_id, properties)


_AckType: TypeAlias = type[Puback] | type[Pubrec] | type[Pubrel] | type[Pubcomp]


def _decode_ack(cur: _Cursor, cls: _AckType) -> Puback | Pubrec | Pubrel | Pubcomp:
    packet_id = cur.packet_id()
    reason_code = cur.byte() if cur.remaining() else ReasonCode.SUCCESS
    properties = cur.properties(cur.packet_type) if cur.remaining() else Properties()
    cur.expect_end()
    return cls(packet_id, reason_code, properties)


def _decode_subscribe(cur: _Cursor) -> Subscribe:
    packet_id = cur.packet_id()
    properties = cur.properties(PacketType.SUBSCRIBE)
    subscriptions = []
    while cur.remaining():
        topic_filter = cur.string()
        options = cur.byte()
        qos = options & 0x03
        retain_handling = (options >> 4) & 0x03
        if options & 0xC0 or qos == 3 or retain_handling == 3:
            raise cur.fail(ReasonCode.MALFORMED_PACKET, "invalid subscription options")
        subscriptions.append(
            Subscription(
                topic_filter, qos, bool(options & 0x04), bool(options & 0x08), retain_handling
            )
        )
    if not subscriptions:
        raise cur.fail(ReasonCode.PROTOCOL_ERROR, "SUBSCRIBE without topic filters")
    return Subscribe(packet_id, subscriptions, properties)


def _decode_unsubscribe(cur: _Cursor) -> Unsubscribe:
    packet_id = cur.packet_id()
    properties = cur.properties(PacketType.UNSUBSCRIBE)
    topic_filters = []
    while cur.remaining():
        topic_filters.append(cur.string())
    if not topic_filters:
        raise cur.fail(ReasonCode.PROTOCOL_ERROR, "UNSUBSCRIBE without topic filters")
    return Unsubscribe(packet_id, topic_filters, properties)


def _decode_reason_codes(cur: _Cursor, cls: type[Suback] | type[Unsuback]) -> Packet:
    packet_id = cur.packet_id()
    properties = cur.properties(cur.packet_type)
    reason_codes = list(cur.data[cur.pos :])
    if not reason_codes:
        raise cur.fail(ReasonCode.PROTOCOL_ERROR, "acknowledgement without reason codes")
    return cls(packet_id, reason_codes, properties)


def _decode_disconnect_or_auth(cur: _Cursor, cls: type[Disconnect] | type[Auth]) -> Packet:
    reason_code = cur.byte() if cur.remaining() else ReasonCode.SUCCESS
    properties = cur.properties(cur.packet_type) if cur.remaining() else Properties()
    cur.expect_end()
    return cls(reason_code, properties)


# Fixed-header flags every packet type except PUBLISH must carry (section 2.1.3).
_REQUIRED_FLAGS: Final = {PacketType.PUBREL: 2, PacketType.SUBSCRIBE: 2, PacketType.UNSUBSCRIBE: 2}


def decode_packet(first_byte: int, body: bytes) -> Packet:
    """Decode one packet from its first header byte and its body (after the length)."""
    packet_type = _PACKET_TYPES[first_byte >> 4] if 0 <= first_byte <= 0xFF else None
    if packet_type is None:
        raise MalformedPacket(ReasonCode.MALFORMED_PACKET, "reserved packet type 0")
    flags = first_byte & 0x0F
    cur = _Cursor(body, packet_type)
    if packet_type is PacketType.PUBLISH:
        return _decode_publish(cur, flags)
    if flags != _REQUIRED_FLAGS.get(packet_type, 0):
        raise cur.fail(ReasonCode.MALFORMED_PACKET, "invalid fixed header flags")
    if packet_type is PacketType.PUBACK:
        return _decode_ack(cur, Puback)
    if packet_type is PacketType.CONNECT:
        return _decode_connect(cur)
    if packet_type is PacketType.CONNACK:
        return _decode_connack(cur)
    if packet_type is PacketType.PUBREC:
        return _decode_ack(cur, Pubrec)
    if packet_type is PacketType.PUBREL:
        return _decode_ack(cur, Pubrel)
    if packet_type is PacketType.PUBCOMP:
        return _decode_ack(cur, Pubcomp)
    if packet_type is PacketType.SUBSCRIBE:
        return _decode_subscribe(cur)
    if packet_type is PacketType.SUBACK:
        return _decode_reason_codes(cur, Suback)
    if packet_type is PacketType.UNSUBSCRIBE:
        return _decode_unsubscribe(cur)
    if packet_type is PacketType.UNSUBACK:
        return _decode_reason_codes(cur, Unsuback)
    if packet_type is PacketType.PINGREQ:
        cur.expect_end()
        return Pingreq()
    if packet_type is PacketType.PINGRESP:
        cur.expect_end()
        return Pingresp()
    if packet_type is PacketType.DISCONNECT:
        return _decode_disconnect_or_auth(cur, Disconnect)
    return _decode_disconnect_or_auth(cur, Auth)


class PacketReader:
    """Incremental decoder: ``feed()`` bytes, then take packets until ``next_packet()`` is None.

    Raises ``MalformedPacket`` on the first invalid packet; the stream cannot be resynchronised
    after that, so the reader keeps raising the same error. A packet whose announced size
    exceeds ``max_packet_size`` is rejected (0x95) as soon as its header arrives, before its
    body is buffered.
    """

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE) -> None:
        if not 2 <= max_packet_size <= MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size must be in 2..{MAX_PACKET_SIZE}")
        self.max_packet_size = max_packet_size
        self._buffer = bytearray()
        self._pos = 0  # start of the first unconsumed byte in _buffer
        self._error: MalformedPacket | None = None

    def feed(self, data: bytes) -> None:
        if self._pos:
            # Deleting a bytearray prefix is cheap in CPython (it moves the start pointer).
            del self._buffer[: self._pos]
            self._pos = 0
        self._buffer += data

    @property
    def next_packet_type(self) -> PacketType | None:
        """Type of the next packet once its first byte has arrived (it may be incomplete)."""
        if self._pos >= len(self._buffer):
            return None
        return _packet_type_or_none(self._buffer[self._pos])

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a packet."""
        return len(self._buffer) - self._pos

    def next_packet(self) -> Packet | None:
        if self._error is not None:
            raise self._error
        try:
            return self._next_packet()
        except MalformedPacket as error:
            self._error = error
            raise

    def _next_packet(self) -> Packet | None:
        buffer = self._buffer
        start = self._pos
        end_of_data = len(buffer)
        if end_of_data - start < 2:
            return None
        first_byte = buffer[start]
        # Reject a bad first byte at once rather than waiting for a body that may never come.
        _check_first_byte(first_byte)
        remaining = 0
        index = start + 1
        for shift in (0, 7, 14, 21):
            if index >= end_of_data:
                return None
            byte = buffer[index]
            index += 1
            remaining |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if byte == 0 and shift:
                    raise MalformedPacket(
                        ReasonCode.MALFORMED_PACKET,
                        "non-minimal remaining length",
                        _packet_type_or_none(first_byte),
                    )
                break
        else:
            raise MalformedPacket(
                ReasonCode.MALFORMED_PACKET,
                "remaining length over 4 bytes",
                _packet_type_or_none(first_byte),
            )
        total = index - start + remaining
        if total > self.max_packet_size:
            raise MalformedPacket(
                ReasonCode.PACKET_TOO_LARGE,
                f"packet of {total} bytes exceeds maximum {self.max_packet_size}",
                _packet_type_or_none(first_byte),
            )
        if end_of_data - start < total:
            return None
        body = bytes(buffer[index : start + total])
        self._pos = start + total
        return decode_packet(first_byte, body)

    def __iter__(self) -> Iterator[Packet]:
        while (packet := self.next_packet()) is not None:
            yield packet


def _check_first_byte(first_byte: int) -> None:
    packet_type = _packet_type_or_none(first_byte)
    if packet_type is None:
        raise MalformedPacket(ReasonCode.MALFORMED_PACKET, "reserved packet type 0")
    flags = first_byte & 0x0F
    if packet_type is PacketType.PUBLISH:
        if flags & 0x06 == 0x06:
            raise MalformedPacket(ReasonCode.MALFORMED_PACKET, "PUBLISH QoS 3", packet_type)
    elif flags != _REQUIRED_FLAGS.get(packet_type, 0):
        raise MalformedPacket(
            ReasonCode.MALFORMED_PACKET, "invalid fixed header flags", packet_type
        )


# Indexed by the high nibble of the first byte; a tuple index is much cheaper than
# PacketType(n), which every packet paid twice.
_PACKET_TYPES: Final[tuple[PacketType | None, ...]] = (None, *PacketType)


def _packet_type_or_none(first_byte: int) -> PacketType | None:
    return _PACKET_TYPES[first_byte >> 4]


# --------------------------------------------------------------------------------------------
# Encoding


def encode_varint(value: int) -> bytes:
    if value < 128:
        if value < 0:
            raise ValueError("variable byte integer must not be negative")
        return bytes((value,))
    if value > MAX_REMAINING_LENGTH:
        raise ValueError(f"variable byte integer {value} too large")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _uint(value: int, size: int) -> bytes:
    try:
        return value.to_bytes(size, "big")
    except OverflowError:
        raise ValueError(f"{value} does not fit in {size} bytes") from None


def _binary(value: bytes) -> bytes:
    if len(value) > _MAX_STRING_BYTES:
        raise ValueError("binary data longer than 65535 bytes")
    return len(value).to_bytes(2, "big") + value


def _string(value: str) -> bytes:
    if "\x00" in value:
        raise ValueError("MQTT strings must not contain U+0000")
    return _binary(value.encode("utf-8"))  # UnicodeEncodeError (a ValueError) for surrogates


def _packet_id(value: int | None) -> bytes:
    if value is None or not 1 <= value <= 65_535:
        raise ValueError(f"packet identifier must be in 1..65535, not {value}")
    return value.to_bytes(2, "big")


def _write_byte(value: int) -> bytes:
    return _uint(value, 1)


def _write_uint16(value: int) -> bytes:
    return _uint(value, 2)


def _write_uint32(value: int) -> bytes:
    return _uint(value, 4)


# Values come from typed Properties fields, so each writer gets the type it expects.
_WRITERS: Final[dict[_Kind, Callable[[Any], bytes]]] = {
    _Kind.BYTE: _write_byte,
    _Kind.UINT16: _write_uint16,
    _Kind.UINT32: _write_uint32,
    _Kind.STRING: _string,
    _Kind.BINARY: _binary,
}


class _PropertyEncoder:
    """Property encoding for one packet type, with field access precomputed.

    Fetching all fields with one ``attrgetter`` call makes the common case (nothing or
    almost nothing set) cheap, which matters because every PUBLISH and PUBACK goes through it.
    """

    __slots__ = ("forbidden_names", "get_allowed", "get_forbidden", "writers")

    def __init__(self, allowed_key: int) -> None:
        permitted = ALLOWED_PROPERTIES[allowed_key]
        allowed = [entry for entry in _SCALAR_PROPERTIES if entry[0] in permitted]
        self.writers = tuple((bytes((pid,)), _WRITERS[kind]) for pid, _, kind in allowed)
        self.get_allowed = _tuple_getter(tuple(name for _, name, _ in allowed))
        self.forbidden_names = tuple(
            name for pid, name, _ in _SCALAR_PROPERTIES if pid not in permitted
        )
        self.get_forbidden = _tuple_getter(self.forbidden_names)


def _tuple_getter(names: tuple[str, ...]) -> Callable[[Properties], tuple[object, ...]]:
    if not names:
        return lambda _: ()
    if len(names) == 1:
        name = names[0]
        return lambda props: (getattr(props, name),)
    return attrgetter(*names)


def encode_properties(props: Properties, allowed_key: int) -> bytes:
    """The property block (length prefix included) for the packet type ``allowed_key``."""
    encoder = _PROPERTY_ENCODERS[allowed_key]
    forbidden = encoder.get_forbidden(props)
    if forbidden.count(None) != len(forbidden):
        names = [
            n for n, v in zip(encoder.forbidden_names, forbidden, strict=True) if v is not None
        ]
        raise ValueError(f"properties {names} not allowed in this packet")
    out = bytearray()
    values = encoder.get_allowed(props)
    if values.count(None) != len(values):
        for (pid_byte, write), value in zip(encoder.writers, values, strict=True):
            if value is not None:
                out += pid_byte
                out += write(value)
    allowed = ALLOWED_PROPERTIES[allowed_key]
    if props.subscription_identifiers:
        if SUBSCRIPTION_IDENTIFIER not in allowed:
            raise ValueError("subscription identifiers not allowed in this packet")
        for identifier in props.subscription_identifiers:
            out.append(SUBSCRIPTION_IDENTIFIER)
            out += encode_varint(identifier)
    if props.user_properties:
        if USER_PROPERTY not in allowed:
            raise ValueError("user properties not allowed in this packet")
        for name, value in props.user_properties:
            out.append(USER_PROPERTY)
            out += _string(name)
            out += _string(value)
    if not out:
        return b"\x00"
    return encode_varint(len(out)) + out


_PROPERTY_ENCODERS: Final = {key: _PropertyEncoder(key) for key in ALLOWED_PROPERTIES}


def _with_header(first_byte: int, body: bytes) -> bytes:
    return bytes((first_byte,)) + encode_varint(len(body)) + body


def _check_qos(qos: int) -> None:
    if qos not in (0, 1, 2):
        raise ValueError(f"QoS must be 0, 1 or 2, not {qos}")


def _encode_publish(packet: Publish) -> bytes:
    _check_qos(packet.qos)
    if packet.dup and not packet.qos:
        raise ValueError("DUP must not be set on QoS 0")
    parts = [_string(packet.topic)]
    if packet.qos:
        parts.append(_packet_id(packet.packet_id))
    elif packet.packet_id is not None:
        raise ValueError("QoS 0 PUBLISH has no packet identifier")
    parts.append(encode_properties(packet.properties, PacketType.PUBLISH))
    parts.append(packet.payload)
    first_byte = 0x30 | packet.dup << 3 | packet.qos << 1 | packet.retain
    return _with_header(first_byte, b"".join(parts))


def _encode_connect(packet: Connect) -> bytes:
    flags = packet.clean_start << 1
    will = packet.will
    if will is not None:
        _check_qos(will.qos)
        flags |= 0x04 | will.qos << 3 | will.retain << 5
    if packet.password is not None:
        flags |= 0x40
    if packet.username is not None:
        flags |= 0x80
    parts = [
        _string("MQTT"),
        bytes((5, flags)),
        _uint(packet.keep_alive, 2),
        encode_properties(packet.properties, PacketType.CONNECT),
        _string(packet.client_id),
    ]
    if will is not None:
        parts += [
            encode_properties(will.properties, WILL_PROPERTIES),
            _string(will.topic),
            _binary(will.payload),
        ]
    if packet.username is not None:
        parts.append(_string(packet.username))
    if packet.password is not None:
        parts.append(_binary(packet.password))
    return _with_header(0x10, b"".join(parts))


def _encode_ack(
    first_byte: int,
    packet_type: PacketType,
    packet_id: int,
    reason_code: int,
    properties: Properties,
) -> bytes:
    # Section 3.4.2.1: reason 0 without properties may be sent as just the packet id.
    props = encode_properties(properties, packet_type)
    if props == b"\x00":
        if reason_code == ReasonCode.SUCCESS:
            return _with_header(first_byte, _packet_id(packet_id))
        return _with_header(first_byte, _packet_id(packet_id) + _uint(reason_code, 1))
    return _with_header(first_byte, _packet_id(packet_id) + _uint(reason_code, 1) + props)


def _encode_reason_codes(
    first_byte: int,
    packet_type: PacketType,
    packet_id: int,
    reason_codes: list[int],
    properties: Properties,
) -> bytes:
    if not reason_codes:
        raise ValueError("at least one reason code is required")
    body = _packet_id(packet_id) + encode_properties(properties, packet_type)
    return _with_header(first_byte, body + bytes(reason_codes))


def _encode_short(
    first_byte: int, packet_type: PacketType, reason_code: int, properties: Properties
) -> bytes:
    # DISCONNECT and AUTH may omit the whole variable header when it would say "0, nothing".
    props = encode_properties(properties, packet_type)
    if props == b"\x00":
        if reason_code == ReasonCode.SUCCESS:
            return bytes((first_byte, 0))
        return _with_header(first_byte, _uint(reason_code, 1))
    return _with_header(first_byte, _uint(reason_code, 1) + props)


def encode(packet: Packet) -> bytes:
    """The wire bytes of ``packet``. Raises ValueError for values MQTT cannot carry."""
    # PUBLISH and PUBACK first: they are nearly all of the traffic.
    if isinstance(packet, Publish):
        return _encode_publish(packet)
    if isinstance(packet, Puback):
        return _encode_ack(
            0x40, PacketType.PUBACK, packet.packet_id, packet.reason_code, packet.properties
        )
    if isinstance(packet, Pingreq):
        return b"\xc0\x00"
    if isinstance(packet, Pingresp):
        return b"\xd0\x00"
    if isinstance(packet, Connect):
        return _encode_connect(packet)
    if isinstance(packet, Connack):
        body = (
            bytes((packet.session_present,))
            + _uint(packet.reason_code, 1)
            + encode_properties(packet.properties, PacketType.CONNACK)
        )
        return _with_header(0x20, body)
    if isinstance(packet, Pubrec):
        return _encode_ack(
            0x50, PacketType.PUBREC, packet.packet_id, packet.reason_code, packet.properties
        )
    if isinstance(packet, Pubrel):
        return _encode_ack(
            0x62, PacketType.PUBREL, packet.packet_id, packet.reason_code, packet.properties
        )
    if isinstance(packet, Pubcomp):
        return _encode_ack(
            0x70, PacketType.PUBCOMP, packet.packet_id, packet.reason_code, packet.properties
        )
    if isinstance(packet, Subscribe):
        if not packet.subscriptions:
            raise ValueError("SUBSCRIBE needs at least one topic filter")
        parts = [
            _packet_id(packet.packet_id),
            encode_properties(packet.properties, PacketType.SUBSCRIBE),
        ]
        for sub in packet.subscriptions:
            _check_qos(sub.qos)
            if sub.retain_handling not in (0, 1, 2):
                raise ValueError(f"retain handling must be 0, 1 or 2, not {sub.retain_handling}")
            options = (
                sub.qos
                | sub.no_local << 2
                | sub.retain_as_published << 3
                | sub.retain_handling << 4
            )
            parts += [_string(sub.topic_filter), bytes((options,))]
        return _with_header(0x82, b"".join(parts))
    if isinstance(packet, Suback):
        return _encode_reason_codes(
            0x90, PacketType.SUBACK, packet.packet_id, packet.reason_codes, packet.properties
        )
    if isinstance(packet, Unsubscribe):
        if not packet.topic_filters:
            raise ValueError("UNSUBSCRIBE needs at least one topic filter")
        parts = [
            _packet_id(packet.packet_id),
            encode_properties(packet.properties, PacketType.UNSUBSCRIBE),
        ]
        parts += [_string(topic_filter) for topic_filter in packet.topic_filters]
        return _with_header(0xA2, b"".join(parts))
    if isinstance(packet, Unsuback):
        return _encode_reason_codes(
            0xB0, PacketType.UNSUBACK, packet.packet_id, packet.reason_codes, packet.properties
        )
    if isinstance(packet, Disconnect):
        return _encode_short(0xE0, PacketType.DISCONNECT, packet.reason_code, packet.properties)
    if isinstance(packet, Auth):
        return _encode_short(0xF0, PacketType.AUTH, packet.reason_code, packet.properties)
    raise TypeError(f"not an MQTT packet: {packet!r}")
