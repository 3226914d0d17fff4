"""What every part of the MQTT 5 codec shares: the packet types (with the fixed-header flags
each must carry), the reason codes, the size limits, and the error any malformed input raises.

Nothing here reads or writes bytes; the reader, the writer, the properties and each packet
family build on it.
"""

from __future__ import annotations

import enum
from typing import Final

# Largest remaining length a variable byte integer can hold, and the largest whole packet.
MAX_REMAINING_LENGTH: Final = 268_435_455
MAX_PACKET_SIZE: Final = 1 + 4 + MAX_REMAINING_LENGTH


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


# Indexed by the high nibble of the first byte; a tuple index is much cheaper than
# PacketType(n), which every packet paid twice.
_PACKET_TYPES: Final[tuple[PacketType | None, ...]] = (None, *PacketType)


def _packet_type_or_none(first_byte: int) -> PacketType | None:
    return _PACKET_TYPES[first_byte >> 4]


# Fixed-header flags every packet type except PUBLISH must carry (section 2.1.3).
_REQUIRED_FLAGS: Final = {PacketType.PUBREL: 2, PacketType.SUBSCRIBE: 2, PacketType.UNSUBSCRIBE: 2}


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
