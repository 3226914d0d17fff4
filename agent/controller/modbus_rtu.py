"""Modbus RTU frames, as a master sends and reads them: pure, no I/O.

A request is the unit id, the function and its data, then the CRC (low byte first). The
master knows each reply's length before it comes (Modbus over Serial Line, §2.5.1):

- read holding / input registers (3, 4): unit, function, byte count, 2 × count, CRC:
  5 + 2n bytes;
- write single register (6), write multiple registers (16): 8 bytes (the echo);
- an exception reply (function | 0x80, exception code): 5 bytes.

So a driver reads a reply by its length (`reply_length`, once the first bytes say which
kind it is) and takes the line falling quiet for longer than the inter-character timeout
as the end of a frame cut short. The functions here build requests and check replies; the
driver does the I/O. (pymodbus can do this too, but its serial client polls for a reply
with sleeps of a few character times, which costs each transaction about twice its line
time: see the README's figures.)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

READ_HOLDING = 3
READ_INPUT = 4
WRITE_SINGLE = 6
WRITE_MULTIPLE = 16
EXCEPTION_FLAG = 0x80
ILLEGAL_DATA_VALUE = 3
"""The exception code of a value the unit will not take."""
MAX_READ = 125
"""The most registers one read may ask for."""
EXCEPTION_REPLY_BYTES = 5
HEADER_BYTES = 3
"""Bytes that tell a reply's length: unit, function, and the byte count of a read."""


class FrameError(ValueError):
    """A reply that is not the answer to the request: a bad CRC, another unit's, nonsense."""


def _table() -> tuple[int, ...]:
    entries = []
    for index in range(256):
        value = index
        for _ in range(8):
            value = (value >> 1) ^ 0xA001 if value & 1 else value >> 1
        entries.append(value)
    return tuple(entries)


_TABLE = _table()


def crc(data: bytes) -> int:
    """CRC-16/MODBUS of `data`."""
    value = 0xFFFF
    for byte in data:
        value = (value >> 8) ^ _TABLE[(value ^ byte) & 0xFF]
    return value


def frame(body: bytes) -> bytes:
    return body + crc(body).to_bytes(2, "little")


def _check_unit(unit_id: int) -> None:
    if not 1 <= unit_id <= 247:
        raise ValueError(f"unit id must be 1..247, not {unit_id}")


# The codec's functions of a frame are memoised (bounded): a line polls the same units with
# the same requests, and their replies repeat while a unit's reading holds still, so most of
# a transaction's encoding, CRCs and decoding is done once per distinct frame, not per poll.
CODEC_MEMO = 1024


@functools.lru_cache(maxsize=CODEC_MEMO)
def read_request(unit_id: int, function: int, first: int, count: int) -> bytes:
    _check_unit(unit_id)
    if function not in (READ_HOLDING, READ_INPUT):
        raise ValueError(f"not a read function: {function}")
    if not 1 <= count <= MAX_READ or not 0 <= first <= 0xFFFF - count + 1:
        raise ValueError(f"cannot read {count} register(s) at {first}")
    return frame(bytes((unit_id, function)) + first.to_bytes(2, "big") + count.to_bytes(2, "big"))


def write_request(unit_id: int, function: int, register: int, raw: int) -> bytes:
    """One register written with function 6, or with 16 (a count of one)."""
    _check_unit(unit_id)
    if not 0 <= register <= 0xFFFF or not 0 <= raw <= 0xFFFF:
        raise ValueError(f"register {register} and value {raw} must be 0..65535")
    address, value = register.to_bytes(2, "big"), raw.to_bytes(2, "big")
    if function == WRITE_SINGLE:
        return frame(bytes((unit_id, function)) + address + value)
    if function == WRITE_MULTIPLE:
        return frame(bytes((unit_id, function)) + address + b"\x00\x01\x02" + value)
    raise ValueError(f"not a write function: {function}")


def reply_bytes(request: bytes) -> int:
    """The length of the normal reply to `request`."""
    function = request[1]
    if function in (READ_HOLDING, READ_INPUT):
        return 5 + 2 * int.from_bytes(request[4:6], "big")
    return 8


def reply_length(head: bytes) -> int | None:
    """The whole reply's length from its first bytes (unit, function, and for a read its
    byte count); None while more are needed to tell."""
    if len(head) < 2:
        return None
    function = head[1]
    if function & EXCEPTION_FLAG:
        return EXCEPTION_REPLY_BYTES
    if function in (READ_HOLDING, READ_INPUT):
        return None if len(head) < 3 else 5 + head[2]
    return 8


@dataclass(frozen=True, slots=True)
class ExceptionReply:
    """The unit refused the request: its exception code (3: an illegal data value)."""

    code: int


def parse_reply(request: bytes, reply: bytes) -> tuple[int, ...] | ExceptionReply | None:
    """The registers a read returned, None for a write's echo, or the unit's refusal.
    FrameError for anything else."""
    return _parse_reply(bytes(request), bytes(reply))  # (a bytearray is no memo's key)


@functools.lru_cache(maxsize=CODEC_MEMO)
def _parse_reply(request: bytes, reply: bytes) -> tuple[int, ...] | ExceptionReply | None:
    if len(reply) < 4 or crc(reply) != 0:
        raise FrameError(f"a bad CRC or a reply cut short: {reply.hex(' ')}")
    if reply[0] != request[0]:
        raise FrameError(f"a reply from unit {reply[0]}, not {request[0]}")
    function = request[1]
    if reply[1] == function | EXCEPTION_FLAG and len(reply) == EXCEPTION_REPLY_BYTES:
        return ExceptionReply(reply[2])
    if reply[1] != function:
        raise FrameError(f"a reply for function {reply[1]}, not {function}")
    if function in (READ_HOLDING, READ_INPUT):
        count = int.from_bytes(request[4:6], "big")
        if reply[2] != 2 * count or len(reply) != 5 + 2 * count:
            raise FrameError(f"{reply[2]} data bytes for {count} register(s)")
        data = reply[3:-2]
        return tuple(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    if len(reply) != 8 or reply[2:6] != request[2:6]:
        raise FrameError(f"a write's echo that does not match: {reply.hex(' ')}")
    return None
