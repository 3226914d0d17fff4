"""The MQTT 5 codec: exact bytes, round trips, malformed input, and topic matching."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.emulator import mqtt_packets as mp
from agent.emulator.mqtt_packets import PacketType, ReasonCode
from tests.support.examples import examples


def decode_all(data: bytes, max_packet_size: int = mp.MAX_PACKET_SIZE) -> list[mp.Packet]:
    reader = mp.PacketReader(max_packet_size)
    reader.feed(data)
    packets = list(reader)
    assert reader.buffered == 0
    return packets


def decode_one(data: bytes) -> mp.Packet:
    (packet,) = decode_all(data)
    return packet


def malformed(data: bytes, max_packet_size: int = mp.MAX_PACKET_SIZE) -> mp.MalformedPacket:
    reader = mp.PacketReader(max_packet_size)
    reader.feed(data)
    with pytest.raises(mp.MalformedPacket) as caught:
        list(reader)
    return caught.value


# ---- exact bytes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
        (268_435_455, b"\xff\xff\xff\x7f"),
    ],
)
def test_variable_byte_integer(value: int, encoded: bytes) -> None:
    assert mp.encode_varint(value) == encoded
    # The same encoding as a remaining length: a PUBLISH whose body is that long.
    if value >= 5 and value < 100_000:
        packet = mp.Publish("t", b"x" * (value - 4))
        assert mp.encode(packet)[1 : 1 + len(encoded)] == encoded
        assert decode_one(mp.encode(packet)) == packet


@pytest.mark.parametrize("value", [-1, 268_435_456])
def test_variable_byte_integer_out_of_range(value: int) -> None:
    with pytest.raises(ValueError):
        mp.encode_varint(value)


def test_known_encodings() -> None:
    assert mp.encode(mp.Connect("test", keep_alive=60)) == (
        b"\x10\x11\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x04test"
    )
    assert mp.encode(mp.Pingreq()) == b"\xc0\x00"
    assert mp.encode(mp.Pingresp()) == b"\xd0\x00"
    assert mp.encode(mp.Disconnect()) == b"\xe0\x00"
    assert mp.encode(mp.Disconnect(0x8E)) == b"\xe0\x01\x8e"
    assert mp.encode(mp.Puback(1)) == b"\x40\x02\x00\x01"
    assert mp.encode(mp.Puback(1, 0x10)) == b"\x40\x03\x00\x01\x10"
    assert mp.encode(mp.Subscribe(2, [mp.Subscription("a/+", 1, True, True, 2)])) == (
        b"\x82\x09\x00\x02\x00\x00\x03a/+\x2d"
    )
    assert mp.encode(mp.Publish("a", b"hi", 1, retain=True, packet_id=5)) == (
        b"\x33\x08\x00\x01a\x00\x05\x00hi"
    )
    assert mp.encode(mp.Connack(0, True, mp.Properties(receive_maximum=10, maximum_qos=1))) == (
        b"\x20\x08\x01\x00\x05\x21\x00\x0a\x24\x01"
    )


def test_short_acknowledgement_forms_decode_to_defaults() -> None:
    # Reason code and properties may be omitted in PUBACK, DISCONNECT and AUTH.
    assert decode_one(b"\x40\x02\x00\x07") == mp.Puback(7)
    assert decode_one(b"\x40\x03\x00\x07\x10") == mp.Puback(7, 0x10)
    assert decode_one(b"\x62\x02\x00\x07") == mp.Pubrel(7)
    assert decode_one(b"\xe0\x00") == mp.Disconnect()
    assert decode_one(b"\xe0\x01\x04") == mp.Disconnect(0x04)
    assert decode_one(b"\xf0\x00") == mp.Auth()


def test_user_properties_keep_order_and_duplicates() -> None:
    pairs = [("k", "2"), ("a", ""), ("k", "1"), ("k", "2"), ("ü", "€")]
    packet = mp.Publish("t", properties=mp.Properties(user_properties=pairs))
    decoded = decode_one(mp.encode(packet))
    assert isinstance(decoded, mp.Publish)
    assert decoded.properties.user_properties == pairs


@pytest.mark.parametrize("length", [0, 1, 300, 65_535])
def test_correlation_data_of_any_length(length: int) -> None:
    data = bytes(n % 256 for n in range(length))
    packet = mp.Publish("t", b"", 1, packet_id=1, properties=mp.Properties(correlation_data=data))
    assert decode_one(mp.encode(packet)) == packet


def test_reader_is_incremental() -> None:
    packets: list[mp.Packet] = [
        mp.Connect("c", will=mp.Will("w", b"bye", 1, True)),
        mp.Publish("a/b", b"x" * 200, 1, packet_id=9),
        mp.Pingreq(),
    ]
    stream = b"".join(mp.encode(packet) for packet in packets)
    reader = mp.PacketReader()
    decoded = []
    for index in range(len(stream)):
        reader.feed(stream[index : index + 1])
        decoded += list(reader)
    assert decoded == packets
    assert reader.next_packet() is None


def test_next_packet_type_from_the_first_byte() -> None:
    reader = mp.PacketReader()
    assert reader.next_packet_type is None
    reader.feed(b"\x30")
    assert reader.next_packet_type is PacketType.PUBLISH
    assert reader.next_packet() is None


# ---- malformed input --------------------------------------------------------------------------


def _connect_body(
    flags: int = 0x02, properties: bytes = b"\x00", rest: bytes = b"\x00\x01c"
) -> bytes:
    body = b"\x00\x04MQTT\x05" + bytes((flags,)) + b"\x00\x00" + properties + rest
    return b"\x10" + mp.encode_varint(len(body)) + body


@pytest.mark.parametrize(
    ("data", "reason_code"),
    [
        (b"\x00\x00", ReasonCode.MALFORMED_PACKET),  # reserved packet type
        (b"\xc1\x00", ReasonCode.MALFORMED_PACKET),  # PINGREQ flags must be 0
        (b"\x80\x00", ReasonCode.MALFORMED_PACKET),  # SUBSCRIBE flags must be 2
        (b"\x36\x00", ReasonCode.MALFORMED_PACKET),  # PUBLISH QoS 3
        (b"\x38\x04\x00\x01a\x00", ReasonCode.PROTOCOL_ERROR),  # DUP on QoS 0
        (b"\x30\xff\xff\xff\xff\x01", ReasonCode.MALFORMED_PACKET),  # 5-byte length
        (b"\x30\x80\x00", ReasonCode.MALFORMED_PACKET),  # non-minimal length
        (b"\xc0\x01\x00", ReasonCode.MALFORMED_PACKET),  # PINGREQ with a body
        (b"\x30\x04\x00\x05ab\x00", ReasonCode.MALFORMED_PACKET),  # string past the end
        (b"\x30\x05\x00\x02\xc3\x28\x00", ReasonCode.MALFORMED_PACKET),  # invalid UTF-8
        (b"\x30\x06\x00\x03\xed\xa0\x80\x00", ReasonCode.MALFORMED_PACKET),  # a surrogate
        (b"\x30\x05\x00\x02a\x00\x00", ReasonCode.MALFORMED_PACKET),  # U+0000
        (b"\x32\x06\x00\x01a\x00\x00\x00", ReasonCode.PROTOCOL_ERROR),  # packet id 0
        (b"\x30\x06\x00\x01a\x02\x7f\x00", ReasonCode.MALFORMED_PACKET),  # unknown property
        (b"\x30\x09\x00\x01a\x02\x02\x00\x00\x00\x05", ReasonCode.MALFORMED_PACKET),  # overruns
        (b"\x30\x08\x00\x01a\x04\x01\x01\x01\x01", ReasonCode.PROTOCOL_ERROR),  # repeated
        (b"\x30\x06\x00\x01a\x02\x01\x02", ReasonCode.PROTOCOL_ERROR),  # format indicator 2
        (b"\x30\x07\x00\x01a\x03\x21\x00\x01", ReasonCode.PROTOCOL_ERROR),  # not in PUBLISH
        (b"\x30\x07\x00\x01a\x03\x23\x00\x00", ReasonCode.PROTOCOL_ERROR),  # topic alias 0
        (b"\x40\x02\x00\x00", ReasonCode.PROTOCOL_ERROR),  # packet id 0
        (b"\x40\x05\x00\x01\x00\x00\x00", ReasonCode.MALFORMED_PACKET),  # trailing byte
        (b"\x82\x03\x00\x01\x00", ReasonCode.PROTOCOL_ERROR),  # SUBSCRIBE without filters
        (b"\x82\x07\x00\x01\x00\x00\x01a\xc0", ReasonCode.MALFORMED_PACKET),  # reserved bits
        (b"\x82\x07\x00\x01\x00\x00\x01a\x30", ReasonCode.MALFORMED_PACKET),  # retain handling 3
        (b"\x82\x07\x00\x01\x00\x00\x01a\x03", ReasonCode.MALFORMED_PACKET),  # QoS 3
        (b"\xa2\x03\x00\x01\x00", ReasonCode.PROTOCOL_ERROR),  # UNSUBSCRIBE without filters
        (b"\x90\x03\x00\x01\x00", ReasonCode.PROTOCOL_ERROR),  # SUBACK without codes
        (b"\x20\x03\x02\x00\x00", ReasonCode.MALFORMED_PACKET),  # CONNACK reserved flag
        (_connect_body(flags=0x03), ReasonCode.MALFORMED_PACKET),  # CONNECT reserved flag
        (_connect_body(flags=0x0A), ReasonCode.MALFORMED_PACKET),  # will QoS without will
        (_connect_body(flags=0x1E), ReasonCode.MALFORMED_PACKET),  # will QoS 3
        (_connect_body(rest=b"\x00\x01c\x00"), ReasonCode.MALFORMED_PACKET),  # trailing
        (_connect_body(properties=b"\x03\x21\x00\x00"), ReasonCode.PROTOCOL_ERROR),  # rcv max 0
        (
            _connect_body(properties=b"\x03\x16\x00\x00"),
            ReasonCode.PROTOCOL_ERROR,
        ),  # data w/o method
        (_connect_body(properties=b"\x02\x01\x00"), ReasonCode.PROTOCOL_ERROR),  # will-only prop
    ],
)
def test_malformed_packets(data: bytes, reason_code: int) -> None:
    assert malformed(data).reason_code == reason_code


def test_malformed_connect_reports_its_packet_type() -> None:
    error = malformed(_connect_body(flags=0x03))
    assert error.packet_type is PacketType.CONNECT
    assert malformed(b"\x00\x00").packet_type is None


@pytest.mark.parametrize(
    ("name", "level"), [(b"MQTT", 4), (b"MQIsdp", 3), (b"MQTT", 6), (b"HTTP", 5)]
)
def test_other_protocol_versions_are_reported(name: bytes, level: int) -> None:
    body = len(name).to_bytes(2, "big") + name + bytes((level,)) + b"\x02\x00\x3c\x00\x01c"
    error = malformed(b"\x10" + bytes((len(body),)) + body)
    assert isinstance(error, mp.UnsupportedProtocolVersion)
    assert error.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    assert error.protocol_level == level


def test_packet_too_large_is_rejected_from_its_header() -> None:
    reader = mp.PacketReader(max_packet_size=100)
    reader.feed(b"\x30\x62")  # 2 + 98 = 100 bytes: allowed, body not here yet
    assert reader.next_packet() is None
    reader = mp.PacketReader(max_packet_size=100)
    reader.feed(b"\x30\x63")  # 101 bytes: refused before any body arrives
    with pytest.raises(mp.MalformedPacket) as caught:
        reader.next_packet()
    assert caught.value.reason_code == ReasonCode.PACKET_TOO_LARGE


def test_reader_keeps_failing_after_an_error() -> None:
    reader = mp.PacketReader()
    reader.feed(b"\x00\x00")
    for _ in range(2):
        with pytest.raises(mp.MalformedPacket):
            reader.next_packet()
    reader.feed(mp.encode(mp.Pingreq()))
    with pytest.raises(mp.MalformedPacket):
        reader.next_packet()


@pytest.mark.parametrize(
    "packet",
    [
        mp.Puback(0),
        mp.Publish("t", qos=1),  # no packet id
        mp.Publish("t", qos=0, packet_id=1),
        mp.Publish("t", qos=3, packet_id=1),
        mp.Publish("t", dup=True),
        mp.Publish("a\x00b"),
        mp.Publish("t", properties=mp.Properties(correlation_data=bytes(65_536))),
        mp.Publish("t", properties=mp.Properties(session_expiry_interval=1)),  # not in PUBLISH
        mp.Connect("c", properties=mp.Properties(topic_alias=1)),
        mp.Connect("c", keep_alive=70_000),
        mp.Puback(1, properties=mp.Properties(user_properties=[("\ud800", "x")])),
        mp.Subscribe(1, []),
        mp.Subscribe(1, [mp.Subscription("a", retain_handling=3)]),
        mp.Suback(1, []),
        mp.Suback(1, [256]),
        mp.Disconnect(properties=mp.Properties(subscription_identifiers=[1])),
    ],
)
def test_unencodable_packets_raise_value_error(packet: mp.Packet) -> None:
    with pytest.raises(ValueError):
        mp.encode(packet)


# ---- property-based ---------------------------------------------------------------------------

mqtt_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)
small_binary = st.binary(max_size=40)
packet_ids = st.integers(1, 65_535)
reason_codes = st.integers(0, 255)


def _property_value(pid: int, kind: Any) -> st.SearchStrategy[Any]:
    if pid == 0x24 or pid in (0x01, 0x17, 0x19, 0x25, 0x28, 0x29, 0x2A):
        return st.integers(0, 1)
    if kind.name == "STRING":
        return mqtt_text
    if kind.name == "BINARY":
        return small_binary
    if kind.name == "BYTE":
        return st.integers(0, 255)
    low = 1 if pid in (0x21, 0x23, 0x27) else 0
    if kind.name == "UINT16":
        return st.integers(low, 65_535)
    return st.integers(low, 2**32 - 1)


@st.composite
def properties_for(draw: st.DrawFn, allowed_key: int) -> mp.Properties:
    allowed = mp.ALLOWED_PROPERTIES[allowed_key]
    props = mp.Properties()
    for pid, (name, kind) in mp.PROPERTY_TABLE.items():
        if pid not in allowed or pid in (mp.USER_PROPERTY, mp.SUBSCRIPTION_IDENTIFIER):
            continue
        setattr(props, name, draw(st.none() | _property_value(pid, kind)))
    if props.authentication_data is not None and props.authentication_method is None:
        props.authentication_method = "method"
    if mp.USER_PROPERTY in allowed:
        props.user_properties = draw(st.lists(st.tuples(mqtt_text, mqtt_text), max_size=4))
    if mp.SUBSCRIPTION_IDENTIFIER in allowed:
        most = 3 if allowed_key == PacketType.PUBLISH else 1
        identifiers = st.lists(st.integers(1, mp.MAX_REMAINING_LENGTH), max_size=most)
        props.subscription_identifiers = draw(identifiers)
    return props


@st.composite
def publishes(draw: st.DrawFn) -> mp.Publish:
    qos = draw(st.integers(0, 2))
    return mp.Publish(
        topic=draw(mqtt_text),
        payload=draw(st.binary(max_size=300)),
        qos=qos,
        retain=draw(st.booleans()),
        dup=draw(st.booleans()) if qos else False,
        packet_id=draw(packet_ids) if qos else None,
        properties=draw(properties_for(PacketType.PUBLISH)),
    )


def _acks(cls: Any, packet_type: PacketType) -> st.SearchStrategy[Any]:
    return st.builds(cls, packet_ids, reason_codes, properties_for(packet_type))


wills = st.builds(
    mp.Will,
    mqtt_text,
    small_binary,
    st.integers(0, 2),
    st.booleans(),
    properties_for(mp.WILL_PROPERTIES),
)
subscriptions = st.builds(
    mp.Subscription, mqtt_text, st.integers(0, 2), st.booleans(), st.booleans(), st.integers(0, 2)
)
packets: st.SearchStrategy[mp.Packet] = st.one_of(
    st.builds(
        mp.Connect,
        mqtt_text,
        st.booleans(),
        st.integers(0, 65_535),
        st.none() | mqtt_text,
        st.none() | small_binary,
        st.none() | wills,
        properties_for(PacketType.CONNECT),
    ),
    st.builds(mp.Connack, reason_codes, st.booleans(), properties_for(PacketType.CONNACK)),
    publishes(),
    _acks(mp.Puback, PacketType.PUBACK),
    _acks(mp.Pubrec, PacketType.PUBREC),
    _acks(mp.Pubrel, PacketType.PUBREL),
    _acks(mp.Pubcomp, PacketType.PUBCOMP),
    st.builds(
        mp.Subscribe,
        packet_ids,
        st.lists(subscriptions, min_size=1, max_size=4),
        properties_for(PacketType.SUBSCRIBE),
    ),
    st.builds(
        mp.Suback,
        packet_ids,
        st.lists(reason_codes, min_size=1, max_size=4),
        properties_for(PacketType.SUBACK),
    ),
    st.builds(
        mp.Unsubscribe,
        packet_ids,
        st.lists(mqtt_text, min_size=1, max_size=4),
        properties_for(PacketType.UNSUBSCRIBE),
    ),
    st.builds(
        mp.Unsuback,
        packet_ids,
        st.lists(reason_codes, min_size=1, max_size=4),
        properties_for(PacketType.UNSUBACK),
    ),
    st.just(mp.Pingreq()),
    st.just(mp.Pingresp()),
    st.builds(mp.Disconnect, reason_codes, properties_for(PacketType.DISCONNECT)),
    st.builds(mp.Auth, reason_codes, properties_for(PacketType.AUTH)),
)


@given(st.lists(packets, min_size=1, max_size=4), st.data())
@pytest.mark.thorough
@settings(max_examples=examples(200, 80), suppress_health_check=[HealthCheck.too_slow])
def test_encode_then_decode_round_trips(items: list[mp.Packet], data: st.DataObject) -> None:
    stream = b"".join(mp.encode(packet) for packet in items)
    # Split the stream at arbitrary points, as TCP may.
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=5)))
    reader = mp.PacketReader()
    decoded: list[mp.Packet] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        reader.feed(stream[start:end])
        decoded += list(reader)
    assert decoded == items
    assert reader.buffered == 0


def _decode_or_reject(data: bytes, max_packet_size: int = mp.MAX_PACKET_SIZE) -> list[mp.Packet]:
    """Decode what it can; only MalformedPacket may escape the reader."""
    reader = mp.PacketReader(max_packet_size)
    reader.feed(data)
    decoded: list[mp.Packet] = []
    try:
        decoded += list(reader)
    except mp.MalformedPacket as error:
        assert isinstance(error.reason_code, int) and 0x80 <= error.reason_code <= 0xFF
    return decoded


def _assert_re_encodes(decoded: list[mp.Packet]) -> None:
    # Anything the reader accepts is something encode() can write back unchanged.
    for packet in decoded:
        assert decode_one(mp.encode(packet)) == packet


@given(st.binary(max_size=200), st.integers(2, 300))
@settings(max_examples=500)
def test_arbitrary_bytes_only_raise_malformed_packet(data: bytes, max_packet_size: int) -> None:
    _assert_re_encodes(_decode_or_reject(data, max_packet_size))


@given(packets, st.data())
@pytest.mark.thorough
@settings(max_examples=examples(300, 100), suppress_health_check=[HealthCheck.too_slow])
def test_corrupted_packets_only_raise_malformed_packet(
    packet: mp.Packet, data: st.DataObject
) -> None:
    # Random bytes rarely get past the fixed header; damaged real packets go deeper.
    wire = bytearray(mp.encode(packet))
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(wire) - 1))
        action = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if action == "flip":
            wire[index] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "delete" and len(wire) > 1:
            del wire[index]
        else:
            wire.insert(index, data.draw(st.integers(0, 255)))
    _assert_re_encodes(_decode_or_reject(bytes(wire)))


@pytest.mark.parametrize("size", [0, 100, 20_000, 3_000_000])
def test_a_publish_head_is_the_packet_up_to_its_payload(size: int) -> None:
    """The lengths in the head count the payload sent after it."""
    packet = mp.Publish(
        "t/x", b"p" * size, 1, packet_id=9, properties=mp.Properties(content_type="c")
    )
    head = mp.encode_publish_head(packet)
    assert head + packet.payload == mp.encode(packet)
