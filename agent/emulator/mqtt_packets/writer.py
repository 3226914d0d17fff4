"""The writer primitives every encoder shares: MQTT data types to bytes (integers, variable
byte integers, strings, binary data, packet identifiers) and the fixed header in front of a
body. A value MQTT cannot carry raises ValueError.
"""

from __future__ import annotations

from typing import Final

from agent.emulator.mqtt_packets.codes import MAX_REMAINING_LENGTH

_MAX_STRING_BYTES: Final = 65_535


def encode_varint(value: int) -> bytes:
    if value < 128:
        if value < 0:
            raise ValueError("variable byte integer must not be negative")
        return bytes((value,))
    if value > MAX_REMAINING_LENGTH:
        raise ValueError(f"variable byte integer {value} too large")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _uint(value: int, size: int) -> bytes:
    try:
        return value.to_bytes(size, "big")
    except OverflowError:
        raise ValueError(f"{value} does not fit in {size} bytes") from None


def _binary(value: bytes) -> bytes:
    if len(value) > _MAX_STRING_BYTES:
        raise ValueError("binary data longer than 65535 bytes")
    return len(value).to_bytes(2, "big") + value


def _string(value: str) -> bytes:
    if "\x00" in value:
        raise ValueError("MQTT strings must not contain U+0000")
    return _binary(value.encode("utf-8"))  # UnicodeEncodeError (a ValueError) for surrogates


def _packet_id(value: int | None) -> bytes:
    if value is None or not 1 <= value <= 65_535:
        raise ValueError(f"packet identifier must be in 1..65535, not {value}")
    return value.to_bytes(2, "big")


def _write_byte(value: int) -> bytes:
    return _uint(value, 1)


def _write_uint16(value: int) -> bytes:
    return _uint(value, 2)


def _write_uint32(value: int) -> bytes:
    return _uint(value, 4)


def _with_header(first_byte: int, body: bytes) -> bytes:
    return bytes((first_byte,)) + encode_varint(len(body)) + body


def _check_qos(qos: int) -> None:
    if qos not in (0, 1, 2):
        raise ValueError(f"QoS must be 0, 1 or 2, not {qos}")
