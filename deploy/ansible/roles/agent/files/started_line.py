"""Waits until one line's agent has taken its part: run on the gateway by the role (as root,
with the agent's Python) after it starts or restarts the line's agent.

    started_line.py LINE [TIMEOUT_S]

The agent tells systemd it is ready as soon as it runs, so that `systemctl start` never
hangs on a broker that is down; what it is doing is its status line (StatusText, what
`systemctl status` shows). Its part is taken once that line names its role: `active for
...` or `standby for ...`; until then it says what it waits for (`connecting to the broker
HOST:PORT; failing since ...: connection refused ...`).

One line on stdout says what happened, then the exit status:
  0  the agent is active or standby (its status line, which may still say what fails)
  2  anything else: it stopped, or had not taken its part in time (its status line)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

POLL_S = 0.2
ROLES = ("active for ", "standby for ")


def run(*args: str) -> str:
    """A command's output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    return subprocess.run(args, capture_output=True, text=True, env=env, check=False).stdout


def unit_state(unit: str) -> tuple[str, str]:
    """(ActiveState, StatusText) of the unit."""
    shown = run("systemctl", "show", "-p", "ActiveState", "-p", "StatusText", unit)
    fields = dict(line.partition("=")[::2] for line in shown.splitlines())
    return fields.get("ActiveState", ""), fields.get("StatusText", "")


def wait(line: str, timeout: float) -> tuple[int, str]:
    unit = f"agent@{line}.service"
    deadline = time.monotonic() + timeout
    while True:
        state, status = unit_state(unit)
        if state == "active" and status.startswith(ROLES):
            return 0, f"{line}: {status}"
        # "activating" is a start under way, or a restart after a failure: still waiting.
        if state not in ("active", "activating", "reloading"):
            return 2, f"{line}: the agent is {state or 'unknown'}: see journalctl -u {unit}"
        if time.monotonic() > deadline:
            said = f": {status}" if status else ""
            return 2, f"{line}: not active nor standby after {timeout:.0f} s{said}"
        time.sleep(POLL_S)


def main(argv: list[str]) -> int:
    line = argv[1]
    timeout = float(argv[2]) if len(argv) > 2 else 120.0
    status, text = wait(line, timeout)
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
