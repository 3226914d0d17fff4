"""Subscriptions: SUBSCRIBE (with each filter's options), SUBACK, UNSUBSCRIBE and UNSUBACK,
their dataclasses, decoders and encoders.

The codec checks the options' reserved bits and that each packet names at least one filter;
whether a topic filter is valid is the caller's to ask (``agent.protocol.mqtt_topics``), since
a server answers an invalid one with a reason code rather than a disconnect.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.emulator.mqtt_packets.codes import PacketType, ReasonCode
from agent.emulator.mqtt_packets.properties import Properties, decode_properties, encode_properties
from agent.emulator.mqtt_packets.reader import _Cursor
from agent.emulator.mqtt_packets.writer import _check_qos, _packet_id, _string, _with_header


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


def _decode_subscribe(cur: _Cursor) -> Subscribe:
    packet_id = cur.packet_id()
    properties = decode_properties(cur, PacketType.SUBSCRIBE)
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
    properties = decode_properties(cur, PacketType.UNSUBSCRIBE)
    topic_filters = []
    while cur.remaining():
        topic_filters.append(cur.string())
    if not topic_filters:
        raise cur.fail(ReasonCode.PROTOCOL_ERROR, "UNSUBSCRIBE without topic filters")
    return Unsubscribe(packet_id, topic_filters, properties)


def _decode_reason_codes(cur: _Cursor, cls: type[Suback] | type[Unsuback]) -> Suback | Unsuback:
    packet_id = cur.packet_id()
    properties = decode_properties(cur, cur.packet_type)
    reason_codes = list(cur.data[cur.pos :])
    if not reason_codes:
        raise cur.fail(ReasonCode.PROTOCOL_ERROR, "acknowledgement without reason codes")
    return cls(packet_id, reason_codes, properties)


def _encode_subscribe(packet: Subscribe) -> bytes:
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
            sub.qos | sub.no_local << 2 | sub.retain_as_published << 3 | sub.retain_handling << 4
        )
        parts += [_string(sub.topic_filter), bytes((options,))]
    return _with_header(0x82, b"".join(parts))


def _encode_unsubscribe(packet: Unsubscribe) -> bytes:
    if not packet.topic_filters:
        raise ValueError("UNSUBSCRIBE needs at least one topic filter")
    parts = [
        _packet_id(packet.packet_id),
        encode_properties(packet.properties, PacketType.UNSUBSCRIBE),
    ]
    parts += [_string(topic_filter) for topic_filter in packet.topic_filters]
    return _with_header(0xA2, b"".join(parts))


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
