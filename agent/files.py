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
