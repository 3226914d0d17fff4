"""A command run in a terminal of a given size (a pty), as a person sees it: what it writes,
read until it exits or until what is wanted has appeared."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Sequence

COLUMNS, ROWS = 80, 24


class Terminal:
    """`python -m agent ARGS` in a COLUMNS x ROWS pty; the environment without AGENT_ names
    and without COLUMNS/LINES (the size is the terminal's)."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        columns: int = COLUMNS,
        rows: int = ROWS,
    ) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        clean = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("AGENT_") and k not in ("COLUMNS", "LINES")
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agent", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**clean, "TERM": "xterm", **(env or {})},
            start_new_session=True,
        )
        os.close(slave)
        self.output = b""

    def read_until(self, done: Callable[[str], bool], timeout: float = 20.0) -> str:
        """What it wrote, once `done(text)` holds or it exits (the text so far either way)."""
        deadline = time.monotonic() + timeout
        while not done(self.text) and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], deadline - time.monotonic())
            if not ready:
                break
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the other side is closed, it has exited
                break
            if not chunk:
                break
            self.output += chunk
        return self.text

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace").replace("\r\n", "\n")

    def close(self) -> int:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 2)  # Ctrl-C
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(10)
        os.close(self.master)
        return self.process.returncode


def run(args: Sequence[str], **options: object) -> str:
    """What a command that ends by itself wrote to the terminal."""
    terminal = Terminal(args, **options)  # type: ignore[arg-type]
    try:
        return terminal.read_until(lambda _: False)
    finally:
        terminal.close()


ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def screen(text: str) -> list[str]:
    """The last frame a command drew in place (after its last clear), escapes removed."""
    last = text.rsplit("\x1b[2J", 1)[-1]
    return ESCAPE.sub("", last).split("\n")
