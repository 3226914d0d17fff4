"""The byte reader every decoder shares: ``_Cursor`` reads MQTT data types (integers,
variable byte integers, strings, binary data, packet identifiers) from one packet body, which
the stream framer (``stream.py``) has already cut out of the byte stream.

Running off the end of the body, or a value the spec forbids, raises ``MalformedPacket`` with
the packet type, so a server can answer with the right reason code. The field readers are
inlined where it pays: every string of every PUBLISH goes through here.
"""

from __future__ import annotations

from agent.emulator.mqtt_packets.codes import MalformedPacket, PacketType, ReasonCode


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

    def expect_end(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(ReasonCode.MALFORMED_PACKET, "trailing bytes after packet")
