"""Starting the project's commands as real processes and waiting for their ready lines."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

READY_URL = re.compile(r"mqtt://([^:\s]+):(\d+)")


class AgentProcess:
    """`python -m agent ARGS`, with stdout read line by line until a pattern shows."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
        )
        self.lines: list[str] = []

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 10.0) -> re.Match[str]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                for line in self.lines:
                    match = pattern.search(line)
                    if match:
                        return match
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    raise TimeoutError(self._describe(f"no {pattern.pattern!r} in time"))
                line = self.proc.stdout.readline()
                if not line:
                    self.proc.wait(5)
                    raise RuntimeError(self._describe("exited before the ready line"))
                self.lines.append(line.decode(errors="replace"))

    def _describe(self, what: str) -> str:
        return f"{what}: {self.proc.args}; stdout={self.lines} stderr={self.stderr_tail()}"

    def stderr_tail(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return "(running)"
        return self.proc.stderr.read().decode(errors="replace")[-2000:]

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return self.proc.returncode
