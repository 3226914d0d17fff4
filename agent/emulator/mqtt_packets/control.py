"""The packets outside publishing and subscribing: PINGREQ and PINGRESP (no body at all),
DISCONNECT and AUTH (a reason code and properties, both left out when they would say
"success, nothing"): their dataclasses, and the decoder and encoder DISCONNECT and AUTH share.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.emulator.mqtt_packets.codes import PacketType, ReasonCode
from agent.emulator.mqtt_packets.properties import Properties, decode_properties, encode_properties
from agent.emulator.mqtt_packets.reader import _Cursor
from agent.emulator.mqtt_packets.writer import _uint, _with_header


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


def _decode_disconnect_or_auth(
    cur: _Cursor, cls: type[Disconnect] | type[Auth]
) -> Disconnect | Auth:
    reason_code = cur.byte() if cur.remaining() else ReasonCode.SUCCESS
    properties = decode_properties(cur, cur.packet_type) if cur.remaining() else Properties()
    cur.expect_end()
    return cls(reason_code, properties)


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
