"""`agent status [LINE or DEVICE]`: a pair at a glance, like `patronictl list`.

Which instance holds the line's lock, its fencing token and the lease left, each instance's
heartbeat (its retained health message), and each device's set point in the store, on the
controller, its last sync and its errors (the active's retained status). Without an
argument, every line whose agents have reported. A device names its line
(`<device>\\line`); with the single-device configuration the line is the device.

`--watch` redraws it in place until Ctrl-C; `--json` prints it as JSON. Connection settings
as for `agent store`.

Exit codes: 0 ok (an active, a standby, every device answering and in sync), 1 no active
(nobody holds the lock, or no agent has reported), 5 degraded (no standby, an instance
failing or silent, a device not answering or not in sync), 6 paused; 2 usage, 3 service
error, 4 connection failure or timeout. With several lines, the worst.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TextIO

from agent.client.cli import (
    EXIT_USAGE,
    UsageError,
    connection_options,
    run_one_shot,
)
from agent.client.statestore import StateStoreClient
from agent.ops import view
from agent.ops.keys import KeyTemplates, line_of
from agent.ops.retained import Retained
from agent.ops.watch import LineWatch, health_filter, lines_reported

NAME = "agent status"
CLEAR = "\x1b[H\x1b[2J"
REDRAW_AT_MOST_S = 0.25
"""Changes arriving together are shown together."""


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
        "--watch",
        "-W",
        action="store_true",
        help="redraw in place on every change and every --interval, until Ctrl-C",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="SECONDS", help="with --watch (1)"
    )
    connection_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def check() -> None:
        if args.interval <= 0:
            raise UsageError("--interval must be positive")

    templates = KeyTemplates()

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
        )

    return run_one_shot(args, NAME, work, check)


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def watches(
    client: StateStoreClient, retained: Retained, templates: KeyTemplates, target: str | None
) -> list[LineWatch]:
    """One watch per line: the target's, or every line that has reported."""
    keys, health = templates.keys, templates.health
    if target is not None:
        line, was_device = await line_of(client, target, keys)
        named = [LineWatch(client, retained, keys, health, line, target if was_device else None)]
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
    footer: Callable[[], list[str]] = list,
) -> int:
    """Prints the status of `target` (every line when None) once, or redraws it until
    `stop`; returns the exit code of the last view."""
    stream = out or sys.stdout
    retained = Retained(client.session)
    try:
        lines = await watches(client, retained, templates, target)
    except ValueError as exc:  # a health topic template that cannot make a filter
        print(f"{NAME}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    clear = watch and stream.isatty()
    while True:
        reports = [view.assess(await w.read(), time.time()) for w in lines]
        code = view.worst([r.code for r in reports])
        if as_json:
            text = view.as_json(reports)
        elif reports:
            text = "\n\n".join(view.render(r) for r in reports)
        else:
            text = (
                f"no agent has reported (no health messages on {health_filter(templates.health)})"
            )
        if watch:
            stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")
            heading = f"agent status {target or ''} at {stamp} (Ctrl-C to stop)"
            text = "\n".join([heading, "", text, *footer()])
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


async def _first(*waits: Any) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
