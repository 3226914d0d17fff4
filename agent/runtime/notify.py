"""The systemd notify protocol (sd_notify), in a few plain lines."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    """Sends READY=1, STATUS=, WATCHDOG=1 and STOPPING=1 to $NOTIFY_SOCKET, if set."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET")
        # An abstract socket is written with a leading '@'.
        self._address = "\0" + address[1:] if address and address.startswith("@") else address
        self._socket: socket.socket | None = None
        if self._address:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._socket.setblocking(False)
        self.watchdog_interval_s = _watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    def send(self, **fields: str) -> None:
        if self._socket is None or self._address is None:
            return
        payload = "\n".join(f"{name.upper()}={value}" for name, value in fields.items())
        try:
            self._socket.sendto(payload.encode(), self._address)
        except OSError as exc:  # systemd gone or busy: never a reason to fail
            log.debug("sd_notify failed: %s", exc)

    def ready(self, status: str) -> None:
        self.send(ready="1", status=status)

    def status(self, status: str) -> None:
        self.send(status=status)

    def watchdog(self) -> None:
        self.send(watchdog="1")

    def stopping(self, status: str) -> None:
        self.send(stopping="1", status=status)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _watchdog_interval(env: os._Environ[str] | dict[str, str]) -> float | None:
    """Half of WatchdogSec=, when the watchdog is meant for this process."""
    usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None
