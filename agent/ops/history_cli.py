"""`agent history [LINE_OR_DEVICE]`: what happened to a pair, like `patronictl history`.

Every takeover (from which instance, and why its lease ended: released, or expired because
it stopped renewing), switchover (who asked), pause and resume, and step-down (why), with
its time, oldest first, as the line's active recorded them in `<line>\\history` (the newest
100 or so are kept). Without an argument, every line whose agents have reported. `--last N`
shows the newest N; `--json` prints them as JSON. Times are UTC, as the agents record them.
A name no agent has reported is refused (--force to read it anyway). Connection settings as
for `agent store`.

Exit codes: 0 shown (also when nothing is recorded yet), 1 a history that cannot be read,
2 usage (a name that is not a valid line or device name included), 7 a name no agent has
reported; 3 and 4 as for `agent store`.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import textwrap
from typing import Any

from agent.client.cli import (
    EXIT_NOT_APPLIED,
    EXIT_OK,
    UsageError,
    connection_options,
    run_one_shot,
)
from agent.client.statestore import StateStoreClient
from agent.ops.history import Entry, InvalidHistory
from agent.ops.history_store import read
from agent.ops.keys import KeyTemplates, key_templates
from agent.ops.names import EXIT_UNKNOWN, UnknownName
from agent.ops.retained import Retained
from agent.ops.target import find, reported, usable_name

NAME = "agent history"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "history",
        help="takeovers, switchovers, pauses and step-downs of a line, with why",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", nargs="?", metavar="LINE_OR_DEVICE")
    parser.add_argument("--last", type=int, metavar="N", help="only the newest N entries")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--force", action="store_true", help="read a line no agent has reported")
    connection_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def check() -> None:
        if args.last is not None and args.last <= 0:
            raise UsageError("--last must be positive")
        if args.target is not None:
            usable_name(args.target)

    templates = key_templates(args)
    return run_one_shot(args, NAME, lambda client: history(client, args, templates), check)


async def history(
    client: StateStoreClient, args: argparse.Namespace, templates: KeyTemplates
) -> int:
    retained = Retained(client.session)
    if args.target is None:
        lines = sorted((await reported(retained, templates)).lines)
    else:
        try:
            target = await find(client, retained, templates, args.target, force=args.force)
        except UnknownName as exc:
            print(f"{NAME}: {exc}; --force to read it anyway", file=sys.stderr)
            return EXIT_UNKNOWN
        lines = [target.line]
    found: dict[str, list[Entry] | None] = {}
    code = EXIT_OK
    for line in lines:
        key = templates.keys.of_line("history", line)
        try:
            entries = await read(client, key)
        except InvalidHistory as exc:
            print(
                f"{NAME}: the history of line {line} in {key} cannot be read: {exc}",
                file=sys.stderr,
            )
            code = EXIT_NOT_APPLIED
            continue
        found[line] = None if entries is None else entries[-args.last :] if args.last else entries
    if args.json:
        documents = {line: [e.document() for e in entries or []] for line, entries in found.items()}
        print(json.dumps({"lines": documents}, indent=2))
    else:
        print(
            "\n\n".join(show(line, entries) for line, entries in found.items())
            or ("no agent has reported a line")
        )
    return code


ISO_UTC = re.compile(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(\.\d+)?Z")
"""A time as the agents write it (ISO 8601, UTC), in an entry or in its why."""


KEEP_TOGETHER = "\xa0"
"""Between a time's date and hour: never wrapped apart (textwrap splits at ASCII spaces)."""


def _utc(text: str) -> str:
    """Every time in `text` as the table shows times: UTC, to the second."""
    return ISO_UTC.sub(lambda m: f"{m.group(1)}{KEEP_TOGETHER}{m.group(2)}", text)


def show(line: str, entries: list[Entry] | None, width: int | None = None) -> str:
    """A line's history, one entry a row, oldest first, every time in UTC (as the agents
    record them, whatever this machine's zone); the reason wrapped under its column to
    `width` (the terminal's), never cut."""
    if not entries:
        return f"Line {line}: no history recorded yet"
    width = width or shutil.get_terminal_size().columns
    rows = [[_utc(e.time), e.event, e.source or "-", e.to or "-", _utc(e.why)] for e in entries]
    headers = ["Time (UTC)", "Event", "From", "To", "Why"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:-1])]
    indent = sum(widths) + 2 * len(widths)
    room = max(20, width - indent)

    def row(cells: list[str]) -> str:
        lead = "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False))
        why = textwrap.wrap(cells[-1], room) or [""]
        lines = [f"{lead}  {why[0]}", *(" " * indent + more for more in why[1:])]
        return "\n".join(lines).replace(KEEP_TOGETHER, " ")

    return "\n".join([f"Line {line}:", row(headers), *(row(r) for r in rows)])
