"""`agent emulator repair --data-dir DIR`: a damaged ``DIR/store.log`` made whole again.

The repaired log holds every whole record before and after the damage, in their order; the
damaged file is kept beside it (``store.log.damaged``, then ``.damaged.1`` ...), and what
was dropped is said, stretch by stretch. A change whose record was in a dropped stretch is
lost: its key holds what it held before that change (a deleted key may be back).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agent.emulator.log_records import replay, salvage
from agent.emulator.persistence import (
    LOG_NAME,
    PersistenceError,
    lock_directory,
    read_log,
)
from agent.files import fsync_directory, write_all


@dataclass(frozen=True, slots=True)
class Repaired:
    log: Path
    damaged: Path | None  # None: the log was whole, nothing was done
    records: int
    keys: int
    dropped: list[tuple[int, int]]  # (offset, length) in the damaged file

    def describe(self) -> str:
        if self.damaged is None:
            return f"{self.log} is whole ({self.records} records, {self.keys} keys): nothing to do"
        stretches = ", ".join(
            f"bytes {offset}..{offset + length - 1} ({length} bytes)"
            for offset, length in self.dropped
        )
        return (
            f"{self.log} repaired: {self.records} whole records kept ({self.keys} keys); "
            f"dropped {sum(length for _, length in self.dropped)} bytes that are no whole "
            f"record: {stretches}. The damaged log is kept as {self.damaged}. A change whose "
            "record was dropped is lost: its key holds what it held before (a deleted key "
            "may be back)."
        )


def repair(directory: Path) -> Repaired:
    """Repairs ``directory``'s log (PersistenceError if it cannot, or is in use)."""
    path = directory / LOG_NAME
    if not path.exists():
        raise PersistenceError(f"{path} does not exist")
    try:
        lock = lock_directory(directory)
    except OSError as exc:
        if isinstance(exc, PersistenceError):
            raise
        raise PersistenceError(f"cannot use the data directory {directory}: {exc}") from None
    try:
        data = read_log(path)
        loaded = replay(data)
        if loaded.damage is None and not loaded.dropped_bytes:
            return Repaired(path, None, salvage(data).records, len(loaded.entries), [])
        salvaged = salvage(data)
        damaged = _free_name(path)
        temporary = path.with_suffix(".repaired")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                write_all(fd, salvaged.log)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.link(path, damaged)
            os.replace(temporary, path)
            fsync_directory(directory)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise PersistenceError(f"cannot write the repaired {path}: {exc}") from None
        keys = len(replay(salvaged.log).entries)
        return Repaired(path, damaged, salvaged.records, keys, salvaged.dropped)
    finally:
        os.close(lock)


def _free_name(path: Path) -> Path:
    candidate = path.with_name(path.name + ".damaged")
    number = 0
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.name}.damaged.{number}")
    return candidate
