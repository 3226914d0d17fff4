"""`agent pause LINE_OR_DEVICE` / `agent resume LINE_OR_DEVICE`: maintenance mode.

Paused, the pair leaves the line alone: the active closes the port (a transaction on the
line finishes first) and writes nothing, to the controllers or the store, so that a
technician can work on the bus. The active keeps the lock, so the standby does not take
over; after a failover or a restart the pause still holds (it is the key `<line>\\paused`,
which both instances watch), and whoever is active leaves the line closed. `agent status`
shows it (exit 6). On resume the active opens the line and reconciles every device: a
change made at a panel meanwhile is published, a change made in the store is applied, and
where both changed, the one that reached the store last wins (as after a takeover).

The command waits (--wait, 10 s) until the active says it has paused or resumed. A name no
agent has reported is refused (--force to pause or resume it anyway, say for a line whose
agents have not started yet). Exit codes: 0 done, 1 already paused (or not paused), 2 not a
valid line or device name, 4 the active did not confirm in time, 7 a name no agent has
reported; connection settings and the other codes as for `agent store`.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import socket
import sys
import time
from typing import Any

from agent.client.cli import (
    EXIT_CONNECTION,
    EXIT_NOT_APPLIED,
    EXIT_OK,
    UsageError,
    connection_options,
    run_one_shot,
)
from agent.client.statestore import Condition, StateStoreClient
from agent.ops import view
from agent.ops.control import PauseNote, now_iso
from agent.ops.keys import KeyTemplates, key_templates
from agent.ops.names import EXIT_UNKNOWN, UnknownName
from agent.ops.retained import Retained
from agent.ops.target import find, usable_name
from agent.ops.watch import LineWatch


def register_pause(subparsers: Any) -> None:
    parser = _parser(subparsers, "pause", "stop driving a line (maintenance); the lock stays")
    parser.add_argument("--reason", default="", help="shown by agent status and in the logs")


def register_resume(subparsers: Any) -> None:
    _parser(subparsers, "resume", "drive a paused line again, reconciling every device")


def _parser(subparsers: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help_text,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", metavar="LINE_OR_DEVICE")
    parser.add_argument(
        "--wait",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="wait until the active confirms (10; 0: do not wait)",
    )
    parser.add_argument("--force", action="store_true", help="act on a name no agent has reported")
    connection_options(parser)
    parser.set_defaults(func=run, pausing=name == "pause")
    return parser


def run(args: argparse.Namespace) -> int:
    name = "agent pause" if args.pausing else "agent resume"

    def check() -> None:
        if args.wait < 0:
            raise UsageError("--wait must not be negative")
        usable_name(args.target)

    templates = key_templates(args)
    return run_one_shot(args, name, lambda client: pause(client, args, templates, name), check)


async def pause(
    client: StateStoreClient, args: argparse.Namespace, templates: KeyTemplates, name: str
) -> int:
    keys = templates.keys
    retained = Retained(client.session)
    try:
        target = await find(client, retained, templates, args.target, force=args.force)
    except UnknownName as exc:
        verb = "pause" if args.pausing else "resume"
        print(f"{name}: {exc}; --force to {verb} it anyway", file=sys.stderr)
        return EXIT_UNKNOWN
    line = target.line
    key = keys.of_line("paused", line)
    if args.pausing:
        note = PauseNote(f"{getpass.getuser()}@{socket.gethostname()}", now_iso(), args.reason)
        result = await client.set(key, note.encode(), condition=Condition.NX)
        if not result.applied:
            current, _ = await client.get(key)
            shown = PauseNote.parse(current).describe() if current is not None else "?"
            print(f"{name}: line {line} is already paused ({shown})", file=sys.stderr)
            return EXIT_NOT_APPLIED
    elif await client.delete(key) == 0:
        print(f"{name}: line {line} is not paused", file=sys.stderr)
        return EXIT_NOT_APPLIED
    done = "paused" if args.pausing else "resumed"
    if args.wait == 0:
        print(f"line {line} {done} (not waiting for the active)")
        return EXIT_OK
    watch = LineWatch(client, retained, keys, templates.health, line, target.device)
    await watch.start()
    deadline = time.monotonic() + args.wait
    while True:
        snapshot = await watch.read()
        if snapshot.holder is None:
            print(f"line {line} {done}; nobody is active: it applies to whoever becomes active")
            return EXIT_OK
        report = view.assess(snapshot, time.time())
        active = snapshot.health.get(report.holder or "", {})
        if active.get("paused") is args.pausing and report.instances[0].up:
            print(f"line {line} {done} by its active {report.holder}: {active.get('summary')}")
            return EXIT_OK
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            print(
                f"{name}: line {line} {done} in the store, but its active {report.holder} "
                f"did not confirm within {args.wait:g} s",
                file=sys.stderr,
            )
            return EXIT_CONNECTION
        watch.retained.changed.clear()
        try:
            async with asyncio.timeout(min(remaining, 1.0)):
                await watch.retained.changed.wait()
        except TimeoutError:
            pass
