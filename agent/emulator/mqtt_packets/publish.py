"""PUBLISH and its acknowledgements (PUBACK, PUBREC, PUBREL, PUBCOMP): their dataclasses,
decoders and encoders.

These are nearly all of the traffic, so this is the hot path of the codec: an acknowledgement
with reason 0 and no properties is sent as just its packet identifier, as the spec allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from agent.emulator.mqtt_packets.codes import PacketType, ReasonCode
from agent.emulator.mqtt_packets.properties import Properties, decode_properties, encode_properties
from agent.emulator.mqtt_packets.reader import _Cursor
from agent.emulator.mqtt_packets.writer import (
    _check_qos,
    _packet_id,
    _string,
    _uint,
    _with_header,
    encode_varint,
)


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


def _decode_publish(cur: _Cursor, flags: int) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise cur.fail(ReasonCode.MALFORMED_PACKET, "PUBLISH QoS 3")
    dup = bool(flags & 0x08)
    if dup and not qos:
        raise cur.fail(ReasonCode.PROTOCOL_ERROR, "DUP set on a QoS 0 PUBLISH")
    topic = cur.string()
    packet_id = cur.packet_id() if qos else None
    properties = decode_properties(cur, PacketType.PUBLISH)
    payload = cur.data[cur.pos :]
    return Publish(topic, payload, qos, bool(flags & 0x01), dup, packet_id, properties)


_AckType: TypeAlias = type[Puback] | type[Pubrec] | type[Pubrel] | type[Pubcomp]


def _decode_ack(cur: _Cursor, cls: _AckType) -> Puback | Pubrec | Pubrel | Pubcomp:
    packet_id = cur.packet_id()
    reason_code = cur.byte() if cur.remaining() else ReasonCode.SUCCESS
    properties = decode_properties(cur, cur.packet_type) if cur.remaining() else Properties()
    cur.expect_end()
    return cls(packet_id, reason_code, properties)


def _encode_publish(packet: Publish) -> bytes:
    return encode_publish_head(packet) + packet.payload


def encode_publish_head(packet: Publish) -> bytes:
    """The bytes of a PUBLISH up to its payload: with the payload after them, the packet.

    For a payload sent to many clients: each needs its own head (topic, packet id), and the
    payload can be written after it without a copy joined to it.
    """
    _check_qos(packet.qos)
    if packet.dup and not packet.qos:
        raise ValueError("DUP must not be set on QoS 0")
    parts = [_string(packet.topic)]
    if packet.qos:
        parts.append(_packet_id(packet.packet_id))
    elif packet.packet_id is not None:
        raise ValueError("QoS 0 PUBLISH has no packet identifier")
    parts.append(encode_properties(packet.properties, PacketType.PUBLISH))
    head = b"".join(parts)
    first_byte = 0x30 | packet.dup << 3 | packet.qos << 1 | packet.retain
    return bytes((first_byte,)) + encode_varint(len(head) + len(packet.payload)) + head


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
