"""A pure MQTT 5 packet codec: bytes in, dataclasses out, and back. No I/O, no asyncio.

``PacketReader`` is incremental in the style of h11: ``feed()`` it whatever arrived on the
wire and pull complete packets with ``next_packet()`` (or iterate it). Every malformed input
raises ``MalformedPacket`` carrying the MQTT 5 reason code a server would put in its
DISCONNECT (or CONNACK). ``encode()`` turns a packet back into bytes.

The codec checks what can be checked from the bytes alone (structure, reserved bits, property
placement and values, UTF-8 strings). Session rules (what a server supports, topic aliases,
which packets a client may send) belong to the caller. Topic name/filter validation and
matching come from ``agent.protocol.mqtt_topics``, shared with the client session.

One module per concern, each importing only those above it:

- ``codes``: packet types, reason codes, size limits, ``MalformedPacket``;
- ``reader`` and ``writer``: the MQTT data types from and to bytes, shared by all decoders
  and encoders;
- ``properties``: the ``Properties`` dataclass, which packet may carry which, the property
  block decoded and encoded;
- one module per packet family, each with its dataclasses, decoder and encoder: ``connect``
  (CONNECT, CONNACK, Will), ``publish`` (PUBLISH and its acknowledgements), ``subscribe``
  (SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK), ``control`` (PINGREQ, PINGRESP, DISCONNECT, AUTH);
- ``codec``: ``decode_packet`` and ``encode``, dispatching to the families;
- ``stream``: ``PacketReader``, which frames packets in a byte stream.

Import the names below from this package; names with a leading underscore are shared
between its modules only.

Reference: MQTT Version 5.0, OASIS Standard, 7 March 2019.
"""

from __future__ import annotations

from agent.emulator.mqtt_packets.codec import Packet, decode_packet, encode
from agent.emulator.mqtt_packets.codes import (
    MAX_PACKET_SIZE,
    MAX_REMAINING_LENGTH,
    MalformedPacket,
    PacketType,
    ReasonCode,
    UnsupportedProtocolVersion,
)
from agent.emulator.mqtt_packets.connect import Connack, Connect, Will
from agent.emulator.mqtt_packets.control import Auth, Disconnect, Pingreq, Pingresp
from agent.emulator.mqtt_packets.properties import (
    ALLOWED_PROPERTIES,
    PROPERTY_TABLE,
    SUBSCRIPTION_IDENTIFIER,
    USER_PROPERTY,
    WILL_PROPERTIES,
    Properties,
    encode_properties,
)
from agent.emulator.mqtt_packets.publish import (
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    encode_publish_head,
)
from agent.emulator.mqtt_packets.stream import PacketReader
from agent.emulator.mqtt_packets.subscribe import (
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
)
from agent.emulator.mqtt_packets.writer import encode_varint
from agent.protocol.mqtt_topics import (
    is_shared_subscription,
    is_valid_topic_filter,
    is_valid_topic_name,
    topic_matches,
)

__all__ = [
    "ALLOWED_PROPERTIES",
    "MAX_PACKET_SIZE",
    "MAX_REMAINING_LENGTH",
    "PROPERTY_TABLE",
    "SUBSCRIPTION_IDENTIFIER",
    "USER_PROPERTY",
    "WILL_PROPERTIES",
    "Auth",
    "Connack",
    "Connect",
    "Disconnect",
    "MalformedPacket",
    "Packet",
    "PacketReader",
    "PacketType",
    "Pingreq",
    "Pingresp",
    "Properties",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "ReasonCode",
    "Suback",
    "Subscribe",
    "Subscription",
    "Unsuback",
    "Unsubscribe",
    "UnsupportedProtocolVersion",
    "Will",
    "decode_packet",
    "encode",
    "encode_properties",
    "encode_publish_head",
    "encode_varint",
    "is_shared_subscription",
    "is_valid_topic_filter",
    "is_valid_topic_name",
    "topic_matches",
]
