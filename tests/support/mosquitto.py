"""Runs Debian's mosquitto on a free loopback port, for tests and benchmarks."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.ports import free_port

CONFIG = """\
listener {port} 127.0.0.1
allow_anonymous true
persistence false
# Without it every request/response pays Nagle's algorithm against delayed ACKs (~40 ms).
set_tcp_nodelay true
# The store service learns of disconnects from these log lines.
log_dest topic
log_type notice
log_type information
connection_messages true
"""


def mosquitto_binary() -> str | None:
    return shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto",) if os.path.exists(p)), None
    )


class Mosquitto:
    """A mosquitto process that can be stopped and started again on the same port."""

    def __init__(self, port: int | None = None) -> None:
        binary = mosquitto_binary()
        if binary is None:
            raise RuntimeError("mosquitto is not installed (apt-get install mosquitto)")
        self.binary = binary
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="mosquitto-"))
        self._conf = self._dir / "mosquitto.conf"
        self._conf.write_text(CONFIG.format(port=self.port))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def listeners(self) -> list[int]:
        """The ports it listens on (a start waits for each: they open one after another)."""
        return [self.port]

    def start(self, timeout: float = 10.0) -> None:
        log = open(self._dir / "mosquitto.log", "ab")  # noqa: SIM115 - owned by the process
        self._proc = subprocess.Popen(
            [self.binary, "-c", str(self._conf)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        deadline = time.monotonic() + timeout
        waiting = self.listeners()
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self._proc.returncode}")
            try:
                with socket.create_connection((self.host, waiting[0]), timeout=0.2):
                    waiting.pop(0)
                if not waiting:
                    return
            except OSError:
                time.sleep(0.02)
        raise TimeoutError("mosquitto did not accept connections")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        path = self._dir / "mosquitto.log"
        return path.read_text(errors="replace") if path.exists() else ""
