"""Free TCP ports on the loopback interface, for servers a test starts as separate processes.

A port is found free here and bound later by another process, so two tests running side by
side (pytest-xdist's workers) must never be handed the same one in between. Each worker draws
from a block of its own, below the kernel's ephemeral range (where the outgoing connections
of every test take their source ports), and a port is handed out once per process, after a
bind shows that nothing holds it now.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading

FIRST = 10_000
"""Below every block: the well-known and registered ports most services use by default."""
BLOCK = 2_000
"""Ports for one worker; enough for a whole run of the suite's tests."""
BLOCKS = 11
"""10,000 to 32,000: below the ephemeral range (32768 on Linux)."""


def _block() -> int:
    """This process's block: the xdist worker's number (gw0, gw1 ...); outside xdist (a
    serial run, a soak or a bench beside a parallel run) the last block."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker[2:].isdigit():
        return BLOCKS - 1
    return int(worker[2:]) % (BLOCKS - 1)


_lock = threading.Lock()
_start = FIRST + _block() * BLOCK
# Where in the block to begin: a second run beside this one (another checkout's suite) starts
# elsewhere, and the bind below skips what it holds.
_next = itertools.cycle(range(_start, _start + BLOCK))
for _ in range(os.getpid() % BLOCK):
    next(_next)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A loopback port nothing holds, not handed out before by this process (per cycle)."""
    with _lock:
        for _ in range(BLOCK):
            port = next(_next)
            if _bindable(port):
                return port
    raise RuntimeError(f"no free port in {_start}..{_start + BLOCK - 1}")
