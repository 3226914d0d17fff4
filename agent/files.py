"""Writing a file so that it survives a power cut: the whole of it written, and a rename
made durable. Shared by the local store's log and the agent's state files."""

from __future__ import annotations

import os
from pathlib import Path


def write_all(fd: int, data: bytes) -> None:
    """All of `data` on `fd` (a regular file's write may be short, on a full disk say)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_directory(directory: Path) -> None:
    """A rename or a new file in `directory` made durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_beside(directory: Path, prefix: str, suffix: str = ".tmp") -> tuple[int, str]:
    """A new file of this process's own in `directory`, opened for writing (mode 0600): the
    one a save writes before renaming it over the file. As tempfile.mkstemp, without what
    importing tempfile brings into memory (shutil and its compressors, about 0.8 MB)."""
    for _ in range(100):
        path = os.path.join(directory, f"{prefix}{os.urandom(6).hex()}{suffix}")
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free name for a new file in {directory}")
