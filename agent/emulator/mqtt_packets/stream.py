"""The stream framer: ``PacketReader`` cuts whole packets out of a byte stream, incrementally
in the style of h11, and hands each to ``decode_packet``.

It reads only the fixed header itself: the first byte (checked at once, so a bad one does not
wait for a body that may never come) and the remaining length (checked against the maximum
packet size before the body is buffered).
"""

from __future__ import annotations

from collections.abc import Iterator

from agent.emulator.mqtt_packets.codec import Packet, decode_packet
from agent.emulator.mqtt_packets.codes import (
    _REQUIRED_FLAGS,
    MAX_PACKET_SIZE,
    MalformedPacket,
    PacketType,
    ReasonCode,
    _packet_type_or_none,
)


class PacketReader:
    """Incremental decoder: ``feed()`` bytes, then take packets until ``next_packet()`` is None.

    Raises ``MalformedPacket`` on the first invalid packet; the stream cannot be resynchronised
    after that, so the reader keeps raising the same error. A packet whose announced size
    exceeds ``max_packet_size`` is rejected (0x95) as soon as its header arrives, before its
    body is buffered.
    """

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE) -> None:
        if not 2 <= max_packet_size <= MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size must be in 2..{MAX_PACKET_SIZE}")
        self.max_packet_size = max_packet_size
        self._buffer = bytearray()
        self._pos = 0  # start of the first unconsumed byte in _buffer
        self._error: MalformedPacket | None = None

    def feed(self, data: bytes) -> None:
        if self._pos:
            # Deleting a bytearray prefix is cheap in CPython (it moves the start pointer).
            del self._buffer[: self._pos]
            self._pos = 0
        self._buffer += data

    @property
    def next_packet_type(self) -> PacketType | None:
        """Type of the next packet once its first byte has arrived (it may be incomplete)."""
        if self._pos >= len(self._buffer):
            return None
        return _packet_type_or_none(self._buffer[self._pos])

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a packet."""
        return len(self._buffer) - self._pos

    def next_packet(self) -> Packet | None:
        if self._error is not None:
            raise self._error
        try:
            return self._next_packet()
        except MalformedPacket as error:
            self._error = error
            raise

    def _next_packet(self) -> Packet | None:
        buffer = self._buffer
        start = self._pos
        end_of_data = len(buffer)
        if end_of_data - start < 2:
            return None
        first_byte = buffer[start]
        # Reject a bad first byte at once rather than waiting for a body that may never come.
        _check_first_byte(first_byte)
        remaining = 0
        index = start + 1
        for shift in (0, 7, 14, 21):
            if index >= end_of_data:
                return None
            byte = buffer[index]
            index += 1
            remaining |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if byte == 0 and shift:
                    raise MalformedPacket(
                        ReasonCode.MALFORMED_PACKET,
                        "non-minimal remaining length",
                        _packet_type_or_none(first_byte),
                    )
                break
        else:
            raise MalformedPacket(
                ReasonCode.MALFORMED_PACKET,
                "remaining length over 4 bytes",
                _packet_type_or_none(first_byte),
            )
        total = index - start + remaining
        if total > self.max_packet_size:
            raise MalformedPacket(
                ReasonCode.PACKET_TOO_LARGE,
                f"packet of {total} bytes exceeds maximum {self.max_packet_size}",
                _packet_type_or_none(first_byte),
            )
        if end_of_data - start < total:
            return None
        body = bytes(buffer[index : start + total])
        self._pos = start + total
        return decode_packet(first_byte, body)

    def __iter__(self) -> Iterator[Packet]:
        while (packet := self.next_packet()) is not None:
            yield packet


def _check_first_byte(first_byte: int) -> None:
    packet_type = _packet_type_or_none(first_byte)
    if packet_type is None:
        raise MalformedPacket(ReasonCode.MALFORMED_PACKET, "reserved packet type 0")
    flags = first_byte & 0x0F
    if packet_type is PacketType.PUBLISH:
        if flags & 0x06 == 0x06:
            raise MalformedPacket(ReasonCode.MALFORMED_PACKET, "PUBLISH QoS 3", packet_type)
    elif flags != _REQUIRED_FLAGS.get(packet_type, 0):
        raise MalformedPacket(
            ReasonCode.MALFORMED_PACKET, "invalid fixed header flags", packet_type
        )
