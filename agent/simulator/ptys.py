"""Pseudo-terminals for the fake devices: a real tty for pyserial to open, at a stable
path (a symlink), that can be made to vanish and come back like an unplugged adapter."""

from __future__ import annotations

import contextlib
import os
import tty
from pathlib import Path


class RawPty:
    """A pty in raw mode. The master stays with the fake device; the slave's name is the
    tty to open. The slave is also held open here: otherwise the master reads EIO
    whenever no client has the port open."""

    def __init__(self) -> None:
        self.master, self._slave = os.openpty()
        # Raw: no echo, no line editing, no CR/LF translation, as a UART would be.
        tty.setraw(self._slave)
        os.set_blocking(self.master, False)
        self.slave_name = os.ttyname(self._slave)

    def close(self) -> None:
        """Close both ends; a client that still has the slave open now reads EIO."""
        for fd in (self.master, self._slave):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.master = self._slave = -1


def point_link(link: Path, target: str) -> None:
    """Make `link` a symlink to `target`, replacing what was there atomically."""
    temporary = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    temporary.symlink_to(target)
    temporary.replace(link)


def remove_link(link: Path, target: str) -> None:
    """Remove `link` if it still points at `target` (another device may own it now)."""
    with contextlib.suppress(OSError):
        if os.readlink(link) == target:
            link.unlink()
