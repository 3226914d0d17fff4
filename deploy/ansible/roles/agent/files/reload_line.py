"""Reloads one line's agent and waits for its answer: run on the gateway by the role (as
root, with the agent's Python) when only the line's devices file changed.

    reload_line.py LINE [TIMEOUT_S]

`systemctl reload agent@LINE` sends the agent SIGHUP; the agent reads its devices file
again and logs what it made of it. That entry is read from the journal (by the agent's
process id: journalctl 252 may skip the first entry of a match right after a cursor, so
the entries are filtered here), and the configuration hash it names is compared with the
hash of the files, as `agent --print-config` computes it: the same hash is what the
instance's health and `agent status` show.

One line on stdout says what happened, then the exit status:
  0  the agent runs what the files say (or it is not running: it reads them when it starts)
  3  the agent refused the change and runs on as it was (its words are the line)
  2  anything else: no answer in time, the agent stopped, or it runs something else
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time

AGENT = "/opt/agent/venv/bin/agent"
POLL_S = 0.2

RELOADED = re.compile(r"reloaded: (.*) \(configuration (\w+), was (\w+)\)")
UNCHANGED = re.compile(r"reload: no device changed \(configuration (\w+)\)")
REFUSED = re.compile(r"reload refused: (.*); running configuration (\w+)")
LATER = re.compile(r"reload: (.*) changed: applies at a restart")


class Failed(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def run(*args: str) -> str:
    """A command's output; its own words when it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    result = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        words = (result.stderr or result.stdout).strip().splitlines()
        raise Failed(2, f"{' '.join(args)}: {words[-1] if words else result.returncode}")
    return result.stdout


def unit_state(unit: str) -> tuple[str, int]:
    """(ActiveState, MainPID) of the unit."""
    shown = dict(
        line.partition("=")[::2]
        for line in run("systemctl", "show", "-p", "ActiveState", "-p", "MainPID", unit).split()
    )
    return shown.get("ActiveState", ""), int(shown.get("MainPID") or 0)


def files_hash(line: str) -> str:
    """The configuration hash of the line's env file and the files it names."""
    printed = json.loads(run(AGENT, "--env-file", f"/etc/agent/{line}.env", "--print-config"))
    return str(printed["derived"]["config_hash"])


def journal_end() -> str:
    out = run("journalctl", "--no-pager", "-q", "-n", "0", "--show-cursor")
    match = re.search(r"-- cursor: (\S+)", out)
    if match is None:
        raise Failed(2, "the journal gave no cursor")
    return match.group(1)


def entries_after(cursor: str) -> list[dict[str, object]]:
    out = run("journalctl", "--no-pager", "-q", "-o", "json", f"--after-cursor={cursor}")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def message(entry: dict[str, object]) -> str:
    text = entry.get("MESSAGE", "")
    if isinstance(text, list):  # not UTF-8: the journal gives the bytes
        return bytes(int(b) for b in text).decode(errors="replace")
    return str(text)


def reload(line: str, timeout: float) -> tuple[int, str]:
    unit = f"agent@{line}.service"
    deadline = time.monotonic() + timeout
    state, pid = unit_state(unit)
    while state in ("activating", "reloading") and time.monotonic() < deadline:
        time.sleep(POLL_S)  # a start in progress: it may have read the files before they changed
        state, pid = unit_state(unit)
    if state != "active" or not pid:
        return 0, f"{line}: not running ({state}): it reads its files when it starts"
    cursor = journal_end()
    with contextlib.suppress(Failed):  # a refused file fails it: the journal below says why
        run("systemctl", "reload", unit)
    later: list[str] = []
    while True:
        for entry in entries_after(cursor):
            cursor = str(entry["__CURSOR"])
            if entry.get("_PID") != str(pid):
                continue
            text = message(entry)
            if found := LATER.search(text):
                later.append(f"{found.group(1)} changed: applies at a restart")
            elif found := REFUSED.search(text):
                return 3, f"{line}: {found.group(0)}"
            elif found := RELOADED.search(text) or UNCHANGED.search(text):
                return checked(line, found, later)
        if unit_state(unit) != ("active", pid):
            return 2, f"{line}: the agent stopped during the reload: see journalctl -u {unit}"
        if time.monotonic() > deadline:
            return 2, f"{line}: no answer in {timeout:.0f} s: see journalctl -u {unit}"
        time.sleep(POLL_S)


def checked(line: str, found: re.Match[str], later: list[str]) -> tuple[int, str]:
    """The agent's answer against the files' hash."""
    running = found.group(2) if found.re is RELOADED else found.group(1)
    expected = files_hash(line)
    said = found.group(0) + "".join(f"; {words}" for words in later)
    if running != expected:
        return 2, (
            f"{line}: {said}, but the files say configuration {expected}: "
            f"restart it (systemctl restart agent@{line})"
        )
    return 0, f"{line}: {said}"


def main(argv: list[str]) -> int:
    line = argv[1]
    timeout = float(argv[2]) if len(argv) > 2 else 60.0
    try:
        status, text = reload(line, timeout)
    except Failed as failure:
        status, text = failure.status, f"{line}: {failure}"
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
