"""`agent status [LINE or DEVICE]`: a pair at a glance, like `patronictl list`.

Which instance holds the line's lock, its fencing token and the lease left, each instance's
heartbeat (its retained health message), and each device's set point in the store, on the
controller, its last sync and its errors (the active's retained status). Without an
argument, every line whose agents have reported. A device names its line
(`<device>\\line`); with the single-device configuration the line is the device.

The view fits the terminal (80x24 when it is not one): the pair, every device while they
fit, else the devices with a problem and a count of the others; `--all` lists every device.
`--watch` redraws it in place until Ctrl-C, through broker outages (it says since when the
broker is unreachable, and carries on when it is back); `--json` prints it all as JSON.
A name no agent has reported is refused (exit 7, naming close matches; --force to show it
anyway, say a line whose agents have not started yet). Connection settings as for
`agent store`.

Exit codes: 0 ok (an active, a standby, every device answering and in sync), 1 no active
(nobody holds the lock, or no agent has reported), 5 degraded (no standby, an instance
failing or silent, a device not answering or not in sync), 6 paused, 7 a name no agent has
reported; 2 usage, 3 service error, 4 connection failure or timeout (for --watch: the broker
unreachable when it stopped). With several lines, the worst.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TextIO

from agent.client.cli import (
    EXIT_CONNECTION,
    EXIT_USAGE,
    UsageError,
    connection_options,
    run_one_shot,
)
from agent.client.errors import StateStoreError
from agent.client.session import SessionError
from agent.client.statestore import StateStoreClient
from agent.ops import view, view_text
from agent.ops.keys import KeyTemplates, key_templates
from agent.ops.names import EXIT_UNKNOWN, UnknownName
from agent.ops.retained import Retained
from agent.ops.target import find, usable_name
from agent.ops.watch import LineWatch, health_filter, lines_reported

NAME = "agent status"
CLEAR = "\x1b[H\x1b[2J"
REDRAW_AT_MOST_S = 0.25
"""Changes arriving together are shown together."""
HEADING_ROWS = 2
"""With --watch: the heading and a blank line above the view."""
RECONNECT_CEILING_S = 2.0
"""With --watch: the longest wait between two attempts to reach the broker again."""


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "status",
        help="the pair serving a line at a glance (exit codes for scripts)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", nargs="?", metavar="LINE_OR_DEVICE")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--all",
        action="store_true",
        dest="every",
        help="list every device, not only those with a problem when they do not all fit",
    )
    parser.add_argument(
        "--watch",
        "-W",
        action="store_true",
        help="redraw in place on every change and every --interval, until Ctrl-C",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="SECONDS", help="with --watch (1)"
    )
    parser.add_argument("--force", action="store_true", help="show a name no agent reported")
    connection_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def check() -> None:
        if args.interval <= 0:
            raise UsageError("--interval must be positive")
        if args.target is not None:
            usable_name(args.target)

    templates = key_templates(args)

    async def work(client: StateStoreClient) -> int:
        stop = _stop_event() if args.watch else asyncio.Event()
        return await show(
            client,
            templates,
            args.target,
            as_json=args.json,
            watch=args.watch,
            interval=args.interval,
            stop=stop,
            every=args.every,
            force=args.force,
        )

    return run_one_shot(args, NAME, work, check)


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def watches(
    client: StateStoreClient,
    retained: Retained,
    templates: KeyTemplates,
    target: str | None,
    *,
    force: bool = False,
) -> list[LineWatch]:
    """One watch per line: the target's, or every line that has reported. A target nobody
    reported is UnknownName, unless `force`."""
    keys, health = templates.keys, templates.health
    if target is not None:
        found = await find(client, retained, templates, target, force=force)
        named = [LineWatch(client, retained, keys, health, found.line, found.device)]
    else:
        await retained.follow(health_filter(health))
        await retained.settle()
        named = [
            LineWatch(client, retained, keys, health, line) for line in lines_reported(retained)
        ]
    for watch in named:
        await watch.start()
    return named


async def show(
    client: StateStoreClient,
    templates: KeyTemplates,
    target: str | None,
    *,
    as_json: bool,
    watch: bool,
    interval: float,
    stop: asyncio.Event,
    out: TextIO | None = None,
    footer: Callable[[int], list[str]] = lambda rows: [],
    footer_rows: int = 0,
    every: bool = False,
    force: bool = False,
) -> int:
    """Prints the status of `target` (every line when None) once, or redraws it until
    `stop`; returns the exit code of the last view. The view fits the terminal with
    `footer_rows` left under it, which `footer(rows left)` fills. A target nobody reported
    is refused (exit 7) unless `force`."""
    stream = out or sys.stdout
    retained = Retained(client.session)
    try:
        lines = await watches(client, retained, templates, target, force=force)
    except UnknownName as exc:
        print(f"{NAME}: {exc}; --force to show it anyway", file=sys.stderr)
        return EXIT_UNKNOWN
    except ValueError as exc:  # a health topic template that cannot make a filter
        print(f"{NAME}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    clear = watch and stream.isatty()
    outage = Outage(client, retained.changed) if watch else None
    while True:
        size = shutil.get_terminal_size()
        rows = size.lines - (HEADING_ROWS if watch else 0) - footer_rows - 1
        code, text = await _frame(lines, outage, as_json, target, templates, rows, size, every)
        if watch:
            stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")
            heading = f"agent status {target or ''} at {stamp} (Ctrl-C to stop)"
            left = size.lines - HEADING_ROWS - text.count("\n") - 2
            text = "\n".join([heading, "", text, *footer(left)])
        stream.write((CLEAR if clear else "") + text + "\n" + ("" if clear else "\n" * watch))
        stream.flush()
        if not watch:
            return code
        retained.changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await _first(retained.changed.wait(), stop.wait())
        if stop.is_set():
            return code
        await asyncio.sleep(REDRAW_AT_MOST_S)


async def _frame(
    lines: list[LineWatch],
    outage: Outage | None,
    as_json: bool,
    target: str | None,
    templates: KeyTemplates,
    rows: int,
    size: os.terminal_size,
    every: bool,
) -> tuple[int, str]:
    """One view: the exit code and the text. While watching, a broker that cannot be
    reached is said (since when), not a reason to stop."""
    try:
        if outage is not None and not outage.client.session.connected:
            raise outage.down
        reports = [view.assess(await w.read(), time.time()) for w in lines]
    except (SessionError, StateStoreError) as exc:
        if outage is None:
            raise
        return EXIT_CONNECTION, outage.say(exc)
    if outage is not None:
        outage.since = None
    code = view.worst([r.code for r in reports])
    if as_json:
        return code, view.as_json(reports)
    if not reports:
        filter_ = health_filter(templates.health)
        return code, f"no agent has reported (no health messages on {filter_})"
    each = max(1, (rows - len(reports) + 1) // len(reports))  # a blank line between two
    shown = [view_text.render(r, rows=each, width=size.columns, every=every) for r in reports]
    return code, "\n\n".join(shown)


class Outage:
    """The broker out of reach while --watch runs: since when, and why; the view is woken
    when the session loses or regains its link."""

    def __init__(self, client: StateStoreClient, wake: asyncio.Event) -> None:
        self.client = client
        self.since: float | None = None
        self.down = SessionError("the connection to the broker is lost; reconnecting")
        session = client.session
        # Back within a few seconds of the broker, not after a backoff grown over a long
        # outage.
        session.set_reconnect_ceiling(RECONNECT_CEILING_S)
        session.on_disconnect(lambda *_: wake.set())

        async def connected() -> None:
            wake.set()

        session.on_connect(connected)

    def say(self, exc: Exception) -> str:
        now = time.time()
        if self.since is None:
            self.since = now
        at = datetime.fromtimestamp(self.since).astimezone().strftime("%H:%M:%S")
        return (
            f" The broker is unreachable since {at} ({view.age(now - self.since)}): {exc}\n"
            " What the line does now is unknown; this view carries on when it is back.\n"
            f" Status: unknown: no broker (exit {EXIT_CONNECTION})"
        )


async def _first(*waits: Any) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
