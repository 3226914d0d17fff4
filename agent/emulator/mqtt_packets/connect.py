"""The connection handshake: CONNECT (with its Will) and CONNACK, their dataclasses, decoders
and encoders.

A CONNECT for another protocol version raises ``UnsupportedProtocolVersion`` before anything
else is read, since older versions lay out the rest differently; a server can still answer
those clients in their own dialect. AUTH, which follows CONNECT in an extended
authentication, has the shape of DISCONNECT and lives with it (``control.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.emulator.mqtt_packets.codes import PacketType, ReasonCode, UnsupportedProtocolVersion
from agent.emulator.mqtt_packets.properties import (
    WILL_PROPERTIES,
    Properties,
    decode_properties,
    encode_properties,
)
from agent.emulator.mqtt_packets.reader import _Cursor
from agent.emulator.mqtt_packets.writer import _binary, _check_qos, _string, _uint, _with_header


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
    properties = decode_properties(cur, PacketType.CONNECT)
    client_id = cur.string()
    will = None
    if has_will:
        will_properties = decode_properties(cur, WILL_PROPERTIES)
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
    properties = decode_properties(cur, PacketType.CONNACK)
    cur.expect_end()
    return Connack(reason_code, bool(ack_flags & 0x01), properties)


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


def _encode_connack(packet: Connack) -> bytes:
    body = (
        bytes((packet.session_present,))
        + _uint(packet.reason_code, 1)
        + encode_properties(packet.properties, PacketType.CONNACK)
    )
    return _with_header(0x20, body)
