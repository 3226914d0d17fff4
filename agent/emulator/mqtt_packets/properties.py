"""MQTT 5 properties: the ``Properties`` dataclass, the table of every property (identifier,
attribute, wire type), which packet may carry which, and the property block's decoding and
encoding, shared by every packet family.

Decoding checks what the spec says of each property: allowed in this packet, not repeated
(but user properties and, in a PUBLISH, subscription identifiers), booleans 0 or 1, some
values never 0, no authentication data without a method. Encoding refuses a property the
packet may not carry.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Final

from agent.emulator.mqtt_packets.codes import MAX_REMAINING_LENGTH, PacketType, ReasonCode
from agent.emulator.mqtt_packets.reader import _Cursor
from agent.emulator.mqtt_packets.writer import (
    _binary,
    _string,
    _write_byte,
    _write_uint16,
    _write_uint32,
    encode_varint,
)


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
# Decoding


def decode_properties(cur: _Cursor, allowed_key: int) -> Properties:
    """The property block (length prefix included) at the cursor, for ``allowed_key``."""
    length = cur.varint()
    end = cur.pos + length
    if end > len(cur.data):
        raise cur.fail(ReasonCode.MALFORMED_PACKET, "properties run past the packet")
    props = Properties()
    if not length:
        return props
    allowed = ALLOWED_PROPERTIES[allowed_key]
    seen: set[int] = set()
    varint = cur.varint
    string = cur.string
    while cur.pos < end:
        pid = varint()
        entry = PROPERTY_TABLE.get(pid)
        if entry is None:
            raise cur.fail(ReasonCode.MALFORMED_PACKET, f"unknown property 0x{pid:02x}")
        if pid not in allowed:
            raise cur.fail(ReasonCode.PROTOCOL_ERROR, f"property {entry[0]} not allowed here")
        name, kind = entry
        if pid == USER_PROPERTY:
            props.user_properties.append((string(), string()))
        elif pid == SUBSCRIPTION_IDENTIFIER:
            value = cur.varint()
            if value == 0:
                raise cur.fail(ReasonCode.PROTOCOL_ERROR, "subscription identifier 0")
            if props.subscription_identifiers and cur.packet_type != PacketType.PUBLISH:
                raise cur.fail(ReasonCode.PROTOCOL_ERROR, "repeated subscription identifier")
            props.subscription_identifiers.append(value)
        else:
            if pid in seen:
                raise cur.fail(ReasonCode.PROTOCOL_ERROR, f"property {name} repeated")
            seen.add(pid)
            setattr(props, name, _property_value(cur, pid, kind))
    if cur.pos != end:
        raise cur.fail(ReasonCode.MALFORMED_PACKET, "property runs past the property block")
    if props.authentication_data is not None and props.authentication_method is None:
        raise cur.fail(ReasonCode.PROTOCOL_ERROR, "authentication data without method")
    return props


def _property_value(cur: _Cursor, pid: int, kind: _Kind) -> int | str | bytes:
    if kind is _Kind.STRING:
        return cur.string()
    if kind is _Kind.BINARY:
        return cur.binary()
    if kind is _Kind.BYTE:
        number = cur.byte()
    elif kind is _Kind.UINT16:
        number = cur.uint16()
    else:
        number = cur.uint32()
    if pid in _BOOLEAN_PROPERTIES and number > 1:
        raise cur.fail(ReasonCode.PROTOCOL_ERROR, f"property 0x{pid:02x} must be 0 or 1")
    if pid in _NONZERO_PROPERTIES and number == 0:
        raise cur.fail(ReasonCode.PROTOCOL_ERROR, f"property 0x{pid:02x} must not be 0")
    return number


# --------------------------------------------------------------------------------------------
# Encoding


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
