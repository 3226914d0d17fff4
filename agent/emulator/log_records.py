"""The records of the store's log (``DIR/store.log``), pure: encoding, replay, salvage.

Each record is framed as ``[length u32][crc32 u32][body]``; its body starts with its kind:
a key written (with its value, version, fencing token and expiry deadline as a wall-clock
time), a key deleted, or a clock record (a bound on every timestamp the service handed out).
`persistence.py` writes and reads the file; this module only turns bytes into changes.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass
from typing import Final

from agent.protocol.hlc import Hlc, HlcError

_FRAME = struct.Struct(">II")  # body length, crc32 of the body
_SET, _DELETE, _CLOCK = b"S", b"D", b"C"
_NO_EXPIRY: Final = -1


@dataclass(frozen=True, slots=True)
class StoredEntry:
    value: bytes
    version: Hlc
    fencing_token: Hlc | None
    expires_at_wall_ms: int | None


@dataclass(frozen=True, slots=True)
class Damage:
    """Where a log is damaged (not a torn tail), and how."""

    offset: int
    size: int  # of the whole log
    why: str


@dataclass(slots=True)
class Loaded:
    entries: dict[bytes, StoredEntry]
    clock_bound: Hlc | None
    dropped_bytes: int  # after the last whole record: a torn tail, or damage
    damage: Damage | None = None  # None: whole, or a torn tail


def _text(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">H", len(raw)) + raw


def _blob(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def _frame(body: bytes) -> bytes:
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def encode_set(key: bytes, entry: StoredEntry) -> bytes:
    token = "" if entry.fencing_token is None else str(entry.fencing_token)
    expiry = _NO_EXPIRY if entry.expires_at_wall_ms is None else entry.expires_at_wall_ms
    return _frame(
        _SET
        + _blob(key)
        + _blob(entry.value)
        + _text(str(entry.version))
        + _text(token)
        + struct.pack(">q", expiry)
    )


def encode_delete(key: bytes) -> bytes:
    return _frame(_DELETE + _blob(key))


def encode_clock(bound: Hlc) -> bytes:
    return _frame(_CLOCK + _text(str(bound)))


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 1

    def take(self, count: int) -> bytes:
        end = self.pos + count
        if end > len(self.data):
            raise ValueError("record ends inside a field")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def blob(self) -> bytes:
        (length,) = struct.unpack(">I", self.take(4))
        return self.take(length)

    def text(self) -> str:
        (length,) = struct.unpack(">H", self.take(2))
        return self.take(length).decode()


_KINDS = (_SET, _DELETE, _CLOCK)
_MAX_RECORD = (1 << 28) + 4096  # a key and a value within the largest MQTT packet
_RECORD_START = re.compile(b"[SDC]")  # the kind byte that follows a frame's header

_Change = tuple[bytes, bytes, StoredEntry | None] | tuple[bytes, Hlc]


def _decode(body: bytes) -> _Change:
    """One record's change: (kind, key, entry) for SET and DELETE, (kind, bound) for CLOCK."""
    reader = _Body(body)
    kind = body[:1]
    if kind == _SET:
        key, value = reader.blob(), reader.blob()
        version = Hlc.parse(reader.text())
        token_text = reader.text()
        (expiry,) = struct.unpack(">q", reader.take(8))
        token = Hlc.parse(token_text) if token_text else None
        return (
            kind,
            key,
            StoredEntry(value, version, token, None if expiry == _NO_EXPIRY else expiry),
        )
    if kind == _DELETE:
        return kind, reader.blob(), None
    if kind == _CLOCK:
        return kind, Hlc.parse(reader.text())
    raise ValueError(f"unknown record type {kind!r}")


def _record_at(data: bytes, pos: int) -> tuple[int, _Change] | None:
    """The end and the change of the whole record at ``pos``, or None if there is none."""
    if pos + _FRAME.size > len(data):
        return None
    length, crc = _FRAME.unpack_from(data, pos)
    end = pos + _FRAME.size + length
    if (
        not length
        or end > len(data)
        or data[pos + _FRAME.size : pos + _FRAME.size + 1] not in _KINDS
    ):
        return None
    body = data[pos + _FRAME.size : end]
    if zlib.crc32(body) != crc:
        return None
    try:
        return end, _decode(body)
    except (ValueError, HlcError, struct.error, UnicodeDecodeError):
        return None


def _next_record(data: bytes, pos: int) -> int:
    """Where the first whole record after ``pos`` starts (``len(data)`` if there is none)."""
    for match in _RECORD_START.finditer(data, pos + 1 + _FRAME.size):
        at = match.start() - _FRAME.size
        if _record_at(data, at) is not None:
            return at
    return len(data)


@dataclass(frozen=True, slots=True)
class Salvaged:
    """What a log holds in whole records, and the stretches of it that are none."""

    log: bytes  # every whole record, in their order
    records: int
    dropped: list[tuple[int, int]]  # (offset, length) of each stretch left out


def salvage(data: bytes, start: int = 0) -> Salvaged:
    """Every whole record from ``start`` on, before and after any damage: a repaired log.

    Records do not overlap, so after one the next is looked for at its end; after damage,
    at the first place where a whole record starts (its checksum makes a false one unlikely,
    though a value may hold the bytes of a whole record).
    """
    pieces: list[bytes] = []
    dropped: list[tuple[int, int]] = []
    pos = start
    while pos < len(data):
        found = _record_at(data, pos)
        if found is not None:
            pieces.append(data[pos : found[0]])
            pos = found[0]
            continue
        following = _next_record(data, pos)
        dropped.append((pos, following - pos))
        pos = following
    return Salvaged(b"".join(pieces), len(pieces), dropped)


def _whole_records_after(data: bytes, pos: int) -> int:
    """How many whole records there are anywhere after ``pos`` (a damaged record's start)."""
    return salvage(data, _next_record(data, pos)).records


def _damage(data: bytes, pos: int) -> Damage | None:
    """None if what follows the last whole record, at ``pos``, is a torn tail."""
    size = len(data)
    if pos == 0:
        return Damage(0, size, "it does not start with a record: not a store log")
    following = _whole_records_after(data, pos)
    if following:
        return Damage(pos, size, f"a record that does not check out, {following} whole after it")
    rest = data[pos:]
    if len(rest) < _FRAME.size or not rest.strip(b"\0"):
        return None  # a header cut short, or zeros (a file extended before its data landed)
    (length,) = struct.unpack_from(">I", rest)
    kind = rest[_FRAME.size : _FRAME.size + 1]
    if (
        length <= _MAX_RECORD
        and kind in (b"", b"\0", *_KINDS)
        and not rest[_FRAME.size + length :].strip(b"\0")
    ):
        return None  # one record cut short, or whose bytes never landed, then only zeros
    return Damage(pos, size, "bytes after the last whole record that are not one record cut short")


def replay(data: bytes) -> Loaded:
    """The state a log describes, up to its last whole record; what follows is torn or damage."""
    entries: dict[bytes, StoredEntry] = {}
    bound: Hlc | None = None
    pos = 0
    while (found := _record_at(data, pos)) is not None:
        pos, change = found
        if len(change) == 2:
            clock = change[1]
            bound = clock if bound is None else max(bound, clock)
            continue
        _, key, entry = change
        if entry is None:
            entries.pop(key, None)
        else:
            entries[key] = entry
            bound = entry.version if bound is None else max(bound, entry.version)
    damage = None if pos == len(data) else _damage(data, pos)
    return Loaded(entries, bound, len(data) - pos, damage)
