"""Starting the project's commands as real processes and waiting for their ready lines."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from typing import Any

READY_URL = re.compile(r"mqtt://([^:\s]+):(\d+)")

STARTUP_S = 30.0
"""How long a process may take to write its first line: an interpreter's start and its
imports took 10 s on a loaded 2-core machine. A wait's timeout counts from that line, so
that it measures what the test waits for, not the start."""

LIVE: weakref.WeakSet[AgentProcess] = weakref.WeakSet()
"""The processes of the test running now: a failed test shows what they said."""


class AgentProcess:
    """`python -m agent ARGS`, with stdout read line by line until a pattern shows."""

    def __init__(
        self,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        *,
        merge_stderr: bool = False,
        prefix: Sequence[str] = (),
    ) -> None:
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        # TEST_AGENT_SOURCE: run the agent from another checkout (an older build, to see a
        # regression test fail on it) while the store and the line run from this one.
        source = os.environ.get("TEST_AGENT_SOURCE")
        if source:
            full_env["PYTHONPATH"] = source
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "agent", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            env=full_env,
            cwd=source or None,
        )
        self.lines: list[str] = []
        self._seen = 0  # lines already matched by wait_for_new()
        self._partial = b""
        LIVE.add(self)

    def tail(self, lines: int = int(os.environ.get("TEST_AGENT_TAIL", "60"))) -> str:
        """What it wrote last, for a failed test's report."""
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            with contextlib.suppress(OSError, ValueError):
                self.drain()
        env_name = " ".join(str(a) for a in self.proc.args[2:]) if self.proc.args else ""
        return f"{env_name} (pid {self.proc.pid}):\n" + "".join(self.lines[-lines:])

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 10.0) -> re.Match[str]:
        """The first line, of all read so far or to come, that matches."""
        self._started(pattern)
        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            for line in self.lines[checked:]:
                match = pattern.search(line)
                if match:
                    return match
            checked = len(self.lines)
            self._read(deadline, pattern)

    def wait_for_new(self, pattern: re.Pattern[str], timeout: float = 10.0) -> re.Match[str]:
        """Like wait_for, but only lines that came after the last wait_for_new match."""
        self._started(pattern)
        deadline = time.monotonic() + timeout
        while True:
            for index in range(self._seen, len(self.lines)):
                match = pattern.search(self.lines[index])
                if match:
                    self._seen = index + 1
                    return match
            self._read(deadline, pattern)

    def _started(self, pattern: re.Pattern[str]) -> None:
        """Waits for the process's first line (STARTUP_S at most), once."""
        deadline = time.monotonic() + STARTUP_S
        while not self.lines:
            self._read(deadline, pattern)

    def _read(self, deadline: float, pattern: re.Pattern[str]) -> None:
        """Reads what the process wrote (whole lines), waiting until `deadline`."""
        assert self.proc.stdout is not None
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, remaining))
        if not ready:
            raise TimeoutError(self._describe(f"no {pattern.pattern!r} in time"))
        if not self._take(os.read(self.proc.stdout.fileno(), 65536)):
            self.proc.wait(5)
            raise RuntimeError(self._describe(f"exited before {pattern.pattern!r}"))

    def _take(self, chunk: bytes) -> bool:
        if not chunk:
            return False
        self._partial += chunk
        *lines, self._partial = self._partial.split(b"\n")
        self.lines.extend(line.decode(errors="replace") + "\n" for line in lines)
        return True

    def drain(self) -> None:
        """Reads what is there without waiting (for assertions on absence)."""
        assert self.proc.stdout is not None
        while select.select([self.proc.stdout], [], [], 0)[0]:
            if not self._take(os.read(self.proc.stdout.fileno(), 65536)):
                return

    def _describe(self, what: str) -> str:
        return f"{what}: {self.proc.args}; stdout={self.lines} stderr={self.stderr_tail()}"

    def stderr_tail(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return "(running or merged)"
        return self.proc.stderr.read().decode(errors="replace")[-2000:]

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> int:
        self.terminate()
        return self.reap(timeout)

    def terminate(self) -> None:
        """Asks it to stop (SIGTERM), without waiting: see reap, and stop_all."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            # One a test paused (SIGSTOP) handles it once it runs again, not after the
            # timeout's kill.
            self.proc.send_signal(signal.SIGCONT)

    def reap(self, timeout: float = 10.0) -> int:
        """Waits for it to stop (killed after `timeout`), and closes its pipes."""
        wait_or_kill(self.proc, timeout)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return self.proc.returncode


def wait_or_kill(proc: subprocess.Popen[Any], timeout: float) -> None:
    """Waits for a process asked to stop; kills it after `timeout`."""
    if proc.poll() is None:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_all(processes: Sequence[AgentProcess], timeout: float = 10.0) -> None:
    """Stops them all at once: each winds down (releases its lock, closes its line) while the
    others do."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.reap(timeout)
