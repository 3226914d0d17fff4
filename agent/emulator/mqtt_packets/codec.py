"""One packet of any type: ``decode_packet`` (its first header byte and body to a dataclass)
and ``encode`` (a dataclass to its wire bytes), each dispatching to the packet's family.

The families (``connect.py``, ``publish.py``, ``subscribe.py``, ``control.py``) never import
this module. The checks are ordered by traffic: PUBLISH and PUBACK first.
"""

from __future__ import annotations

from typing import TypeAlias

from agent.emulator.mqtt_packets.codes import (
    _PACKET_TYPES,
    _REQUIRED_FLAGS,
    MalformedPacket,
    PacketType,
    ReasonCode,
)
from agent.emulator.mqtt_packets.connect import (
    Connack,
    Connect,
    _decode_connack,
    _decode_connect,
    _encode_connack,
    _encode_connect,
)
from agent.emulator.mqtt_packets.control import (
    Auth,
    Disconnect,
    Pingreq,
    Pingresp,
    _decode_disconnect_or_auth,
    _encode_short,
)
from agent.emulator.mqtt_packets.publish import (
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    _decode_ack,
    _decode_publish,
    _encode_ack,
    _encode_publish,
)
from agent.emulator.mqtt_packets.reader import _Cursor
from agent.emulator.mqtt_packets.subscribe import (
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    _decode_reason_codes,
    _decode_subscribe,
    _decode_unsubscribe,
    _encode_reason_codes,
    _encode_subscribe,
    _encode_unsubscribe,
)

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
        return _encode_connack(packet)
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
        return _encode_subscribe(packet)
    if isinstance(packet, Suback):
        return _encode_reason_codes(
            0x90, PacketType.SUBACK, packet.packet_id, packet.reason_codes, packet.properties
        )
    if isinstance(packet, Unsubscribe):
        return _encode_unsubscribe(packet)
    if isinstance(packet, Unsuback):
        return _encode_reason_codes(
            0xB0, PacketType.UNSUBACK, packet.packet_id, packet.reason_codes, packet.properties
        )
    if isinstance(packet, Disconnect):
        return _encode_short(0xE0, PacketType.DISCONNECT, packet.reason_code, packet.properties)
    if isinstance(packet, Auth):
        return _encode_short(0xF0, PacketType.AUTH, packet.reason_code, packet.properties)
    raise TypeError(f"not an MQTT packet: {packet!r}")
