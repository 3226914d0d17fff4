"""The store's contents on disk (`agent emulator --data-dir DIR`), as the real service keeps them.

One append-only log, ``DIR/store.log``: a record per change (a key written with its value,
version, fencing token and expiry deadline as a wall-clock time; a key deleted), and now and
then a clock record, a bound on every timestamp the service has handed out, so that its
clock never goes backwards across a restart. Each record is framed as
``[length u32][crc32 u32][body]``. The log is rewritten from the live keys (compacted) at
load and whenever it has grown to several times their size.

At load, what follows the last whole record is a torn tail (a crash mid-write) when it can
only be the start of one record cut short: it is dropped, with a warning. Anything else is
damage: a record that does not check out with whole records after it, a file that does not
start with a record (every log does: it is written whole, then appended to), a file that is
not a regular one. Then the emulator does not start, says where the damage is, and leaves
the file as it is: it is the only copy of what comes after the damage.

Writes never block the event loop: records are encoded on it (cheap) and handed to one
writer thread, which appends, flushes and fsyncs them in batches. A reply does not wait for
its record to reach the disk: a crash loses at most the last moments of writes.

When a write fails (a full disk), its partial record is cut off and nothing more is appended:
the journal is not ``writable()`` and the store refuses every write, saying so, until a
rewrite of the whole log from the live keys succeeds (``retry()``, asked by a refused write
and every second, and once more at ``close()``). The keys are in memory meanwhile, those
whose records failed too, so none is lost when the disk has room again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import re
import stat
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.emulator.store import Entry
from agent.protocol.hlc import Hlc, HlcError

log = logging.getLogger(__name__)

LOG_NAME: Final = "store.log"
LOCK_NAME: Final = "store.lock"  # held (flock) by the emulator using the directory
_FRAME = struct.Struct(">II")  # body length, crc32 of the body
_SET, _DELETE, _CLOCK = b"S", b"D", b"C"
_NO_EXPIRY: Final = -1
_MAX_DEADLINE: Final = (1 << 63) - 1
# The clock record is written this far ahead of the clock, and renewed when the clock gets
# within half of it: one small record a second or so under load, none when idle.
CLOCK_LEASE_MS: Final = 2_000
_COMPACT_MIN_BYTES: Final = 1 << 20
_COMPACT_FACTOR: Final = 4
_MAX_BATCH: Final = 4096  # records per write; the thread takes what is there, up to this
_RETRY_MIN_MS: Final = 100  # after a failure, rewrites are tried at most this often


class PersistenceError(OSError):
    """The data directory cannot be used."""


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


# ---------------------------------------------------------------------------- records (pure)


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


def _whole_records_after(data: bytes, pos: int) -> int:
    """How many whole records there are anywhere after ``pos`` (a damaged record's start)."""
    count = 0
    for match in _RECORD_START.finditer(data, pos + 1 + _FRAME.size):
        at = match.start() - _FRAME.size
        if at >= pos + 1 and (found := _record_at(data, at)) is not None:
            count += 1
            pos = found[0] - 1  # records do not overlap: look on after this one
    return count


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


# ---------------------------------------------------------------------------- the journal


class _Compact:
    """Rewrite the log with these records: a compaction, or a retry after a failure."""

    def __init__(self, records: Callable[[], Iterator[bytes]]) -> None:
        self.records = records


class StoreJournal:
    """Keeps ``DIR/store.log`` in step with a StateStore (it is the store's journal)."""

    def __init__(
        self,
        directory: Path,
        wall_clock: Callable[[], int],
        monotonic_clock: Callable[[], int],
    ) -> None:
        self.directory = directory
        self.path = directory / LOG_NAME
        self._wall = wall_clock
        self._monotonic = monotonic_clock
        self._queue: queue.SimpleQueue[bytes | _Compact | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._file: int | None = None
        self._lease_ms = 0
        self._written = 0  # bytes appended since the last compaction
        self._live_estimate = 0  # the size of the log right after the last compaction
        # Set by the writer thread when a write fails, cleared when a rewrite succeeds; the
        # event loop reads it (writable()).
        self.failed: OSError | None = None
        self._retrying = False  # a rewrite after a failure is queued
        self._compaction_due = False
        self._retried_at: int | None = None  # when the last one was queued (monotonic ms)
        self._size = 0  # bytes of whole records in the log (the writer thread's)
        self._lock: int | None = None  # the open DIR/store.lock while this journal holds it
        self._entries: Callable[[], dict[bytes, Entry]] | None = None

    # ---- blocking: before serving and after (call in a worker thread) -----------------------

    def load(self) -> Loaded:
        """The keys the log holds; PersistenceError if it cannot be read or is damaged."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._take_lock()
            data = self._read()
        except OSError as exc:
            self._release_lock()
            if isinstance(exc, PersistenceError):
                raise
            raise PersistenceError(
                f"cannot use the data directory {self.directory}: {exc}"
            ) from None
        loaded = replay(data)
        damage = loaded.damage
        if damage is not None:
            self._release_lock()
            raise PersistenceError(
                f"{self.path} is damaged at byte {damage.offset} of {damage.size} "
                f"({damage.why}); not started, and the file is left as it is: "
                "move it aside to start without it"
            )
        if loaded.dropped_bytes:
            log.warning(
                "%s: dropped %d bytes of a torn last record (a crash mid-write)",
                self.path,
                loaded.dropped_bytes,
            )
        return loaded

    def _take_lock(self) -> None:
        """One emulator at a time in a directory: a second would lose the first one's keys."""
        fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise PersistenceError(
                f"{self.directory} is in use by another emulator ({holder})"
            ) from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        self._lock = fd

    def _release_lock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing it releases the lock
            self._lock = None

    def _read(self) -> bytes:
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return b""
        if not stat.S_ISREG(status.st_mode):
            raise PersistenceError(f"{self.path} is not a regular file")
        return self.path.read_bytes()

    def open(self, entries: Callable[[], dict[bytes, Entry]], clock: Hlc) -> None:
        """Rewrites the log from the live keys, then starts the writer thread."""
        self._entries = entries
        self._lease_ms = clock.wall_ms + CLOCK_LEASE_MS
        records = list(self._snapshot(dict(entries())))
        records.append(encode_clock(Hlc(self._lease_ms, 0, clock.node_id)))
        self._live_estimate = sum(map(len, records))
        self._rewrite(records)
        self._thread = threading.Thread(target=self._run, name="store-journal", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Writes what is queued and stops the writer thread.

        After a failed write, tries once more to rewrite the log: the store is stopped by
        then, so nothing changes the keys meanwhile.
        """
        if self._thread is None:
            self._release_lock()
            return
        if self.failed is not None and self._entries is not None:
            self._queue.put(self._compaction())
        self._queue.put(None)
        self._thread.join()
        self._thread = None
        if self._file is not None:
            os.close(self._file)
            self._file = None
        self._release_lock()
        if self.failed is not None:
            log.error(
                "%s could not be written before stopping (%s): the changes since the "
                "first failure are lost",
                self.path,
                self.failed,
            )

    # ---- on the event loop (StateStore calls these) ------------------------------------------

    def writable(self) -> bool:
        """Whether changes are kept: not from a failed write until a rewrite succeeds.

        A writer refused meanwhile has a rewrite tried (``retry()``), so that writes are
        accepted again soon after the disk has room.
        """
        if self.failed is None:
            return True
        self.retry()
        return False

    def retry(self) -> None:
        """After a failed write, queues a rewrite of the log from the live keys (one at a time,
        at most every ``_RETRY_MIN_MS``)."""
        if self.failed is None or self._retrying or self._entries is None:
            return
        now = self._monotonic()
        if self._retried_at is not None and now - self._retried_at < _RETRY_MIN_MS:
            return
        self._retried_at = now
        self._retrying = True
        self._queue.put(self._compaction())

    def put(self, key: bytes, entry: Entry) -> None:
        self._append(encode_set(key, self._stored(entry)))

    def delete(self, key: bytes) -> None:
        self._append(encode_delete(key))

    def observe_clock(self, current: Hlc) -> None:
        """The store calls this after each request and each expiry, its changes made: renews
        the clock bound before the clock can reach it, and queues a compaction that came due
        (then, not when the record that made it due came: its snapshot must see that change)."""
        if current.wall_ms + CLOCK_LEASE_MS // 2 > self._lease_ms:
            self._lease_ms = current.wall_ms + CLOCK_LEASE_MS
            self._append(encode_clock(Hlc(self._lease_ms, 0, current.node_id)))
        if self._compaction_due:
            self._compaction_due = False
            self._queue.put(self._compaction())

    def _append(self, record: bytes) -> None:
        self._queue.put(record)
        self._written += len(record)
        if (
            self._entries is not None
            and self._written > _COMPACT_MIN_BYTES
            and self._written > _COMPACT_FACTOR * self._live_estimate
        ):
            self._compaction_due = True  # queued by observe_clock()

    def _compaction(self) -> _Compact:
        """A rewrite of the log from the keys as they are now."""
        assert self._entries is not None
        snapshot = dict(self._entries())  # entries are replaced, never changed: consistent
        self._written = 0
        self._live_estimate = sum(len(k) + len(e.value) + 48 for k, e in snapshot.items())
        lease = encode_clock(Hlc(self._lease_ms, 0, "journal"))

        def records() -> Iterator[bytes]:
            yield from self._snapshot(snapshot)
            yield lease

        return _Compact(records)

    def _stored(self, entry: Entry) -> StoredEntry:
        expires = entry.expires_at_ms
        wall = None if expires is None else self._wall() + (expires - self._monotonic())
        if wall is not None:
            # The store takes any PX of up to 19 digits; a deadline past what the log's
            # signed 64-bit field holds (some 292 million years) is kept as its largest.
            wall = min(wall, _MAX_DEADLINE)
        return StoredEntry(entry.value, entry.version, entry.fencing_token, wall)

    def _snapshot(self, entries: dict[bytes, Entry]) -> Iterator[bytes]:
        for key, entry in entries.items():
            yield encode_set(key, self._stored(entry))

    # ---- the writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch: list[bytes] = []
            stop = False
            while True:
                if item is None:
                    stop = True
                    break
                if isinstance(item, _Compact):
                    self._write(batch)
                    batch = []
                    self._rewrite(list(item.records()))
                    self._retrying = False
                else:
                    batch.append(item)
                if len(batch) >= _MAX_BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            self._write(batch)
            if stop:
                return

    def _write(self, batch: list[bytes]) -> None:
        if not batch or self._file is None or self.failed is not None:
            return  # after a failure, only a rewrite from the live keys writes again
        data = b"".join(batch)
        try:
            _write_all(self._file, data)
            os.fsync(self._file)
        except OSError as exc:
            self._fail(exc)
            return
        self._size += len(data)

    def _fail(self, error: OSError) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._file, self._size)  # no torn record left in the log
        if self.failed is None:
            log.error(
                "cannot write %s (%s): writes are refused until it can be written again",
                self.path,
                error,
            )
        self.failed = error

    def _rewrite(self, records: list[bytes]) -> None:
        """Replaces the log atomically with ``records`` and appends to the new one."""
        data = b"".join(records)
        temporary = self.path.with_suffix(".tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
            directory = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
            appending = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)  # what it holds of a full disk is freed
            if self._thread is None:
                raise PersistenceError(f"cannot write {self.path}: {exc}") from None
            self._fail(exc)
            return
        if self._file is not None:
            os.close(self._file)
        self._file = appending
        self._size = len(data)
        if self.failed is not None:
            log.warning("%s can be written again: writes are accepted", self.path)
            self.failed = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
