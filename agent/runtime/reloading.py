"""`agent reload`, the unit's ExecReload=: SIGHUP to the running agent, then its verdict.

A signal alone cannot fail: `systemctl reload` returned 0 whatever the agent made of its
files, and a refused file went unseen until the next restart failed on it. The agent writes
each reload's verdict to ``$RUNTIME_DIRECTORY/reload`` (``ReloadVerdicts``), and this command
waits for the one that follows its signal: exit 0 when the files loaded, 1 with the agent's
words when it refused them (so `systemctl reload` fails, and says why in the journal), 1 when
no verdict comes within --wait. The last refusal also stays in the agent's health, and so in
`agent status`, until a reload loads.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

VERDICT_FILE = "reload"
WAIT_S = 60.0
POLL_S = 0.05
EXIT_OK, EXIT_REFUSED = 0, 1


# --------------------------------------------------------------------------- pure


@dataclass(frozen=True, slots=True)
class Verdict:
    reloads: int
    """How many reloads the agent has ended (each a verdict), since it started."""
    refused: str | None
    """Why the last one was refused, or None when it loaded."""
    at: float


def encode(verdict: Verdict) -> bytes:
    document = {"reloads": verdict.reloads, "refused": verdict.refused, "at": verdict.at}
    return json.dumps(document).encode()


def decode(raw: bytes) -> Verdict | None:
    """The verdict, or None for anything that is not one (a file half written by hand)."""
    try:
        document = json.loads(raw)
        reloads, refused, at = document["reloads"], document["refused"], document["at"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(reloads, int) or not isinstance(at, int | float):
        return None
    return Verdict(reloads, refused if isinstance(refused, str) else None, float(at))


# --------------------------------------------------------------------------- the agent's side


def runtime_directory() -> Path | None:
    """systemd's RuntimeDirectory= (the first, when several), or None outside systemd."""
    named = os.environ.get("RUNTIME_DIRECTORY")
    return Path(named.split(":")[0]) if named else None


class ReloadVerdicts:
    """What the agent says of its reloads: the last refusal, kept until a reload loads (for
    its health), and each verdict written for `agent reload` to read."""

    def __init__(self, directory: Path | None) -> None:
        self.path = None if directory is None else directory / VERDICT_FILE
        self.last: Verdict | None = None

    @property
    def refused(self) -> str | None:
        return None if self.last is None else self.last.refused

    def record(self, refused: str | None) -> None:
        """One reload ended: loaded (None) or refused (why). Blocking: call it in a thread."""
        count = 0 if self.last is None else self.last.reloads
        self.last = Verdict(count + 1, refused, time.time())
        if self.path is None:
            return
        partial = self.path.with_name(f".{VERDICT_FILE}.new")
        try:
            partial.write_bytes(encode(self.last))
            partial.replace(self.path)  # whole, never half written, for the reader
        except OSError as exc:
            print(f"agent: cannot write the reload verdict {self.path}: {exc}", file=sys.stderr)


# --------------------------------------------------------------------------- the command


def register(subparsers: Any) -> None:
    import argparse  # the command's only: the running agent never parses a command line

    parser: argparse.ArgumentParser = subparsers.add_parser(
        "reload",
        help="the unit's ExecReload=: reload the running agent and wait for its verdict",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--pid", type=int, help="the agent's process (default: $MAINPID, as systemd sets it)"
    )
    parser.add_argument(
        "--runtime-dir",
        type=Path,
        help="where the agent writes its verdicts (default: $RUNTIME_DIRECTORY)",
    )
    parser.add_argument(
        "--wait", type=float, default=WAIT_S, metavar="SECONDS", help=f"at most ({WAIT_S:g})"
    )
    parser.set_defaults(func=run)


def _read(path: Path) -> Verdict | None:
    try:
        return decode(path.read_bytes())
    except OSError:
        return None


def run(args: argparse.Namespace) -> int:
    pid = args.pid if args.pid is not None else int(os.environ.get("MAINPID") or 0)
    directory = args.runtime_dir or runtime_directory()
    if pid <= 0 or directory is None:
        print("agent reload: no agent to reload: give --pid and --runtime-dir", file=sys.stderr)
        return 2
    path = directory / VERDICT_FILE
    before = _read(path)
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        print(f"agent reload: cannot signal process {pid}: {exc.strerror}", file=sys.stderr)
        return EXIT_REFUSED
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        verdict = _read(path)
        if verdict is not None and verdict != before:
            if verdict.refused is None:
                return EXIT_OK  # the agent logs what it changed
            print(f"agent reload: refused: {verdict.refused}", file=sys.stderr)
            return EXIT_REFUSED
        time.sleep(POLL_S)
    print(f"agent reload: no verdict from process {pid} within {args.wait:g} s", file=sys.stderr)
    return EXIT_REFUSED
