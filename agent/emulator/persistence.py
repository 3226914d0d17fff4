"""The store's contents on disk (`agent emulator --data-dir DIR`), as the real service keeps them.

One append-only log, ``DIR/store.log`` (its records: `log_records.py`): a record per change,
and now and then a clock record, a bound on every timestamp the service has handed out, so
that its clock never goes backwards across a restart. A whole log is appended to as it is at
start (it needs no room for a copy); it is rewritten from the live keys (compacted) when it
has grown to several times their size, and only if the disk has room for the copy.

At load, what follows the last whole record is a torn tail (a crash mid-write) when it can
only be the start of one record cut short: it is cut off, with a warning. Anything else is
damage: the emulator does not start, says where the damage is and how to repair it
(`agent emulator repair`, `repair.py`), and leaves the file as it is.

Writes never block the event loop: records are encoded on it (cheap) and handed to one
writer thread, which appends them in batches. Each record has a number (``appended``); the
thread reports, on the event loop, the number up to which records are kept (``durable``),
and the service answers a request only once the records made before its reply are kept
(`service.py`). Kept means, by ``FsyncPolicy``: fsynced (ALWAYS, the default: one fsync for
every record that arrived meanwhile, then all their replies), or written to the file
(EVERYSEC: fsynced within a second; NO: when the system flushes it).

When a write fails (a full disk), its partial record is cut off, the records after the last
kept one are dropped and the store takes their changes back (its listener is told), so that
their requests are answered with an error and what the store holds is what the log holds.
Then SETs are refused (``writable()``) while deletes and clock records are still written:
the reserve, ``DIR/store.reserve`` (64 KiB kept for this), is freed to make room for them.
Every second (and on a refused SET, at most every 100 ms) the reserve is made again, and
when that succeeds, or when a compaction that frees room succeeds and then the reserve
does, SETs are accepted again.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import logging
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.emulator.log_records import (
    Loaded,
    StoredEntry,
    encode_clock,
    encode_delete,
    encode_set,
    replay,
)
from agent.emulator.store import Entry
from agent.files import fsync_directory, write_all
from agent.protocol.hlc import Hlc

log = logging.getLogger(__name__)

LOG_NAME: Final = "store.log"
LOCK_NAME: Final = "store.lock"  # held (flock) by the emulator using the directory
RESERVE_NAME: Final = "store.reserve"
RESERVE_BYTES: Final = 64 * 1024  # freed when the disk is full, for deletes' records
_MAX_DEADLINE: Final = (1 << 63) - 1
# The clock record is written this far ahead of the clock, and renewed when the clock gets
# within half of it: one small record a second or so under load, none when idle.
CLOCK_LEASE_MS: Final = 2_000
_COMPACT_MIN_BYTES: Final = 1 << 20
_COMPACT_FACTOR: Final = 4
_MAX_BATCH: Final = 4096  # records per write; the thread takes what is there, up to this
_RETRY_MIN_MS: Final = 100  # after a failure, recovery is tried at most this often
_EVERYSEC_S: Final = 1.0


class FsyncPolicy(enum.Enum):
    """When a record counts as kept, so that its request may be answered."""

    ALWAYS = "always"  # fsynced: a power cut loses nothing acknowledged
    EVERYSEC = "everysec"  # in the file, fsynced every second: a power cut loses ~1 s
    NO = "no"  # in the file, fsynced when the system flushes it (Linux: ~30 s)


class PersistenceError(OSError):
    """The data directory cannot be used."""


Listener = Callable[[int, OSError | None], None]
"""Called on the event loop: (number of the last record kept, the error that stopped the
records after it from being kept, or None)."""


@dataclass(frozen=True, slots=True)
class _Rewrite:
    """Rewrite the log with these records (a compaction), made from the keys as they were
    when record ``seq`` was the last appended; ``recover``: after a failed write."""

    seq: int
    records: Callable[[], Iterator[bytes]]
    recover: bool


@dataclass(frozen=True, slots=True)
class _Resume:
    """The store took back every change up to record ``seq``: write what comes after."""

    seq: int


_Item = tuple[int, bytes] | _Rewrite | _Resume | None


class StoreJournal:
    """Keeps ``DIR/store.log`` in step with a StateStore (it is the store's journal)."""

    def __init__(
        self,
        directory: Path,
        wall_clock: Callable[[], int],
        monotonic_clock: Callable[[], int],
        fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
    ) -> None:
        self.directory = directory
        self.path = directory / LOG_NAME
        self.fsync = fsync
        self._wall = wall_clock
        self._monotonic = monotonic_clock
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: Listener | None = None
        self._file: int | None = None
        self._lease_ms = 0
        self._written = 0  # bytes appended since the last compaction
        self._live_estimate = 0  # the size of the live keys' records at the last compaction
        self._lock: int | None = None  # the open DIR/store.lock while this journal holds it
        self._entries: Callable[[], dict[bytes, Entry]] | None = None
        self._whole_size = 0  # of the log at load, up to its last whole record
        # The event loop's: records numbered, the last one kept, the failure being lived with.
        self.appended = 0
        self.durable = 0
        self.failed: OSError | None = None
        self._retrying = False  # a recovery is queued (cleared by the thread)
        self._retried_at: int | None = None  # when the last one was queued (monotonic ms)
        self._compaction_due = False
        # The writer thread's.
        self._size = 0  # bytes of whole records in the log
        self._kept = 0  # the last record kept
        self._failing = False  # since a failed write, until the reserve is made again
        self._discarding = False  # from a failed write until the store took its changes back
        self._unsynced = False
        self._synced_at = 0.0
        self._reserved = False

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
                f"`agent emulator repair --data-dir {self.directory}` writes a log of every "
                "whole record before and after the damage and keeps this one beside it"
            )
        if loaded.dropped_bytes:
            log.warning(
                "%s: dropped %d bytes of a torn last record (a crash mid-write)",
                self.path,
                loaded.dropped_bytes,
            )
        self._whole_size = len(data) - loaded.dropped_bytes
        return loaded

    def _take_lock(self) -> None:
        self._lock = lock_directory(self.directory)

    def _release_lock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing it releases the lock
            self._lock = None

    def _read(self) -> bytes:
        return read_log(self.path)

    def open(
        self,
        entries: Callable[[], dict[bytes, Entry]],
        clock: Hlc,
        listener: Listener | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """Appends to the log as loaded (a torn tail cut off), then starts the writer thread.

        ``listener`` is called on ``loop`` (or, without one, on the writer thread).
        """
        self._entries = entries
        self._listener = listener
        self._loop = loop
        existed = self.path.exists()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                if os.fstat(fd).st_size != self._whole_size:
                    os.ftruncate(fd, self._whole_size)  # the torn tail: frees, needs no room
                    os.fsync(fd)
                if not existed:
                    fsync_directory(self.directory)
            except OSError:
                os.close(fd)
                raise
        except OSError as exc:
            raise PersistenceError(f"cannot write {self.path}: {exc}") from None
        self._file = fd
        self._size = self._written = self._whole_size
        self._live_estimate = _estimate(entries())
        self._synced_at = time.monotonic()
        if not self._make_reserve():
            self._failing = True
            self.failed = OSError(f"no room for {RESERVE_NAME} ({RESERVE_BYTES} bytes)")
            log.error(
                "%s: the disk is full: SETs are refused until there is room, deletes are accepted",
                self.directory,
            )
        self._thread = threading.Thread(target=self._run, name="store-journal", daemon=True)
        self._thread.start()
        self._lease_ms = clock.wall_ms + CLOCK_LEASE_MS
        self._append(encode_clock(Hlc(self._lease_ms, 0, clock.node_id)))

    def close(self) -> None:
        """Writes what is queued (fsynced, whatever the policy) and stops the writer thread."""
        if self._thread is None:
            self._release_lock()
            return
        self._queue.put(None)
        self._thread.join()
        self._thread = None
        if self._file is not None:
            os.close(self._file)
            self._file = None
        self._release_lock()

    # ---- on the event loop (StateStore calls these) ------------------------------------------

    def writable(self) -> bool:
        """Whether a SET is kept now: not from a failed write until the reserve is made again.

        A SET refused meanwhile has a recovery tried (``retry()``), so that SETs are
        accepted again soon after the disk has room.
        """
        if self.failed is None:
            return True
        self.retry()
        return False

    def retry(self) -> None:
        """After a failed write, queues a recovery (one at a time, at most every
        ``_RETRY_MIN_MS``): the reserve made again, or else a compaction, then the reserve."""
        if self.failed is None or self._retrying or self._entries is None:
            return
        now = self._monotonic()
        if self._retried_at is not None and now - self._retried_at < _RETRY_MIN_MS:
            return
        self._retried_at = now
        self._retrying = True
        self._queue.put(self._compaction(recover=True))

    def put(self, key: bytes, entry: Entry) -> int:
        return self._append(encode_set(key, self._stored(entry)))

    def delete(self, key: bytes) -> int:
        return self._append(encode_delete(key))

    def observe_clock(self, current: Hlc) -> None:
        """The store calls this after each request and each expiry, its changes made: renews
        the clock bound before the clock can reach it, and queues a compaction that came due
        (then, not when the record that made it due came: its snapshot must see that change)."""
        if current.wall_ms + CLOCK_LEASE_MS // 2 > self._lease_ms:
            self._lease_ms = current.wall_ms + CLOCK_LEASE_MS
            self._append(encode_clock(Hlc(self._lease_ms, 0, current.node_id)))
        if self._compaction_due:
            self._compaction_due = False
            self._queue.put(self._compaction(recover=False))

    def _append(self, record: bytes) -> int:
        self.appended += 1
        self._queue.put((self.appended, record))
        self._written += len(record)
        if (
            self._entries is not None
            and self._written > _COMPACT_MIN_BYTES
            and self._written > _COMPACT_FACTOR * self._live_estimate
        ):
            self._compaction_due = True  # queued by observe_clock()
        return self.appended

    def _compaction(self, *, recover: bool) -> _Rewrite:
        """A rewrite of the log from the keys as they are now."""
        assert self._entries is not None
        snapshot = dict(self._entries())  # entries are replaced, never changed: consistent
        self._written = 0
        self._live_estimate = _estimate(snapshot)
        lease = encode_clock(Hlc(self._lease_ms, 0, "journal"))

        def records() -> Iterator[bytes]:
            yield from self._snapshot(snapshot)
            yield lease

        return _Rewrite(self.appended, records, recover)

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

    def _on_report(self, kept: int, error: OSError | None, recovered: bool) -> None:
        """On the event loop: what the writer thread kept, failed to keep, or recovered."""
        if error is not None:
            if self.failed is None:
                log.error(
                    "cannot write %s (%s): the changes not yet written are taken back and "
                    "answered with an error; SETs are refused until it can be written again, "
                    "deletes are accepted",
                    self.path,
                    error,
                )
            self.failed = error
            self._lease_ms = 0  # its clock record may be among those dropped: one more
            if self._listener is not None:
                self._listener(kept, error)
            self._queue.put(_Resume(self.appended))
            return
        if recovered and self.failed is not None:
            log.warning("%s can be written again: SETs are accepted", self.path)
            self.failed = None
        if kept > self.durable:
            self.durable = kept
            if self._listener is not None:
                self._listener(kept, None)

    # ---- the writer thread -------------------------------------------------------------------

    def _report(self, kept: int, error: OSError | None = None, recovered: bool = False) -> None:
        if self._loop is None:
            self._on_report(kept, error, recovered)
            return
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            self._loop.call_soon_threadsafe(self._on_report, kept, error, recovered)

    def _run(self) -> None:
        while True:
            timeout = None
            if self._unsynced and self.fsync is FsyncPolicy.EVERYSEC:
                timeout = max(0.0, self._synced_at + _EVERYSEC_S - time.monotonic())
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                self._sync()
                continue
            batch: list[tuple[int, bytes]] = []
            while True:
                if item is None:
                    self._write(batch)
                    self._sync()
                    return
                if isinstance(item, tuple):
                    batch.append(item)
                else:
                    self._write(batch)
                    batch = []
                    if isinstance(item, _Resume):
                        self._discarding = False
                    else:
                        self._rewrite_for(item)
                if len(batch) >= _MAX_BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            self._write(batch)

    def _write(self, batch: list[tuple[int, bytes]]) -> None:
        if not batch or self._file is None or self._discarding:
            return  # discarding: the store takes these changes back
        data = b"".join(record for _, record in batch)
        before = self._size
        try:
            write_all(self._file, data)
            self._size += len(data)
            due = self.fsync is FsyncPolicy.EVERYSEC and (
                time.monotonic() - self._synced_at >= _EVERYSEC_S
            )
            if self.fsync is FsyncPolicy.ALWAYS or due:
                os.fsync(self._file)  # a failure takes this batch back, as any other
                self._unsynced = False
                self._synced_at = time.monotonic()
            else:
                self._unsynced = True
        except OSError as exc:
            self._fail(exc, before)
            return
        self._kept = batch[-1][0]
        self._report(self._kept)

    def _sync(self) -> None:
        """EVERYSEC: what was written is fsynced every second; EVERYSEC and NO: at close."""
        if not self._unsynced or self._file is None:
            return
        self._unsynced = False
        self._synced_at = time.monotonic()
        try:
            os.fsync(self._file)
        except OSError as exc:
            self._fail(exc, self._size)

    def _fail(self, error: OSError, size: int) -> None:
        """Cuts off the failed batch, frees the reserve, and tells the store."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._file, size)  # no torn record left in the log
        self._size = size
        self._release_reserve()
        self._failing = True
        self._discarding = True
        self._report(self._kept, error)

    def _rewrite_for(self, item: _Rewrite) -> None:
        if item.recover:
            self._retrying = False
        if self._discarding:
            return  # made before the failure was known: it holds changes taken back since
        if not self._failing:
            if self._rewrite(list(item.records())):
                self._make_reserve()  # a compaction that made room may allow it again
            return
        if not item.recover:
            return
        if self._make_reserve() or (self._rewrite(list(item.records())) and self._make_reserve()):
            self._failing = False
            self._report(self._kept, recovered=True)

    def _rewrite(self, records: list[bytes]) -> bool:
        """Replaces the log atomically with ``records``; False, the log kept, if it cannot."""
        data = b"".join(records)
        temporary = self.path.with_suffix(".tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
            fsync_directory(self.directory)
            appending = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)  # what it holds of a full disk is freed
            if not self._failing:
                log.warning(
                    "%s could not be compacted (%s): it is appended to as it is", self.path, exc
                )
            return False
        if self._file is not None:
            os.close(self._file)
        self._file = appending
        self._size = len(data)
        self._unsynced = False
        return True

    def _make_reserve(self) -> bool:
        """``DIR/store.reserve``, RESERVE_BYTES really on the disk; False if there is no room."""
        if self._reserved:
            return True
        path = self.directory / RESERVE_NAME
        with contextlib.suppress(OSError):
            status = os.stat(path)
            if status.st_size == RESERVE_BYTES and status.st_blocks * 512 >= RESERVE_BYTES:
                self._reserved = True
                return True
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                write_all(fd, bytes(RESERVE_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            return False
        self._reserved = True
        return True

    def _release_reserve(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.directory / RESERVE_NAME)
        self._reserved = False


def read_log(path: Path) -> bytes:
    """The log's bytes (none if there is no log yet); PersistenceError if it is no file."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return b""
    if not stat.S_ISREG(status.st_mode):
        raise PersistenceError(f"{path} is not a regular file")
    return path.read_bytes()


def lock_directory(directory: Path) -> int:
    """Holds ``DIR/store.lock`` (the open file, closed to release it): one emulator (or
    repair) at a time in a directory, since a second would lose the first one's keys."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise PersistenceError(f"{directory} is in use by another emulator ({holder})") from None
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}\n".encode())
    return fd


def _estimate(entries: dict[bytes, Entry]) -> int:
    return sum(len(key) + len(entry.value) + 48 for key, entry in entries.items())
