"""Whether a standby could take over now, checked without touching the line.

A standby never opens the port (the active drives the line). What it can check without
sending a byte: a local device path exists and this process may open it read-write; a
serial device server (socket://, rfc2217://) accepts a TCP connection, closed again at
once with nothing sent. A standby that fails these is not ready: health says why, and
`agent status` shows it as a problem before the active's failure would reveal it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from agent.controller.driver import is_device_path

log = logging.getLogger("agent")

CONNECT_TIMEOUT_S = 2.0
CHECK_INTERVAL_S = 30.0
"""How often a standby looks (a serial server sees one connection that often)."""


def check_port(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why this serial URL could not be driven now, or None. Blocking: run it in a thread."""
    if not url:
        return "no serial port configured (AGENT_SERIAL__URL)"
    if is_device_path(url):
        if not os.path.exists(url):
            return f"serial port {url} does not exist (AGENT_SERIAL__URL)"
        if not os.access(url, os.R_OK | os.W_OK):
            return f"serial port {url} cannot be opened read-write by this user"
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("socket", "rfc2217"):
        return None  # another pyserial URL: nothing to check without opening it
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        return f"serial URL {url} has no valid port (AGENT_SERIAL__URL)"
    if not host or port is None:
        return f"serial URL {url} names no host and port (AGENT_SERIAL__URL)"
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        return f"serial server {host}:{port} does not accept a connection ({reason})"
    return None


async def check_port_async(url: str) -> str | None:
    return await asyncio.to_thread(check_port, url)


class Readiness:
    """A standby's look at its line, every CHECK_INTERVAL_S while it is not active."""

    def __init__(self, url: str, line: str, instance: str) -> None:
        self.url = url
        self.line = line
        self.instance = instance
        self.not_ready: str | None = None
        """Why this instance could not take over, as last checked (None: ready)."""

    async def check(self) -> bool:
        """Checks once; True if the answer changed."""
        found = await check_port_async(self.url)
        if found == self.not_ready:
            return False
        if found is not None:
            log.error(
                "standby %s of line %s could not take over: %s; fix it before the active "
                "fails (agent status shows it as a problem)",
                self.instance,
                self.line,
                found,
            )
        else:
            log.info("standby %s of line %s is ready to take over again", self.instance, self.line)
        self.not_ready = found
        return True

    async def run(self, active: Callable[[], bool], changed: Callable[[], None]) -> None:
        """Checks every CHECK_INTERVAL_S while not `active()`; `changed()` on a new answer."""
        while True:
            if not active() and await self.check():
                changed()
            await asyncio.sleep(CHECK_INTERVAL_S)
