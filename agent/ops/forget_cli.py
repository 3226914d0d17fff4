"""`agent forget LINE [INSTANCE]`: a decommissioned line, or a stopped instance, no longer
listed.

What the agents leave in the broker and the store outlives them: the retained health of a
stopped instance, or of a line taken out of service, keeps it in `agent status` for good
(a line without an active is exit 1). With INSTANCE, that instance's retained health is
cleared. Without, the whole line's: every instance's health, its devices' retained status,
availability and telemetry (those the line published), the line's keys (`paused`,
`switchover`, `history`, and the lock unless it is held) and each `<device>\\line` key that
names the line. The devices' set points and sync records stay: they are the building's.
The keys an agent fenced are deleted with a fencing token of this machine's clock, newer
than any lease of the line's dead agents.

Refused (exit 1) while an agent of the line is live (its heartbeat is fresh) or holds the
lock, or for INSTANCE while it is: stop it first (--force to clear it all the same; the
lock of a live line is kept even then). Exit 7 for a line or instance no agent has
reported (--force to clear what its names would be), 2 for a name that is not valid;
connection settings and the other exit codes as for `agent store`.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from agent.client.cli import (
    EXIT_NOT_APPLIED,
    EXIT_OK,
    connection_options,
    run_one_shot,
)
from agent.client.statestore import StateStoreClient
from agent.config.nearest import suggestions
from agent.ops import view
from agent.ops.keys import KeyTemplates, key_templates
from agent.ops.names import EXIT_UNKNOWN, Reported, unknown
from agent.ops.retained import Retained
from agent.ops.target import reported, usable_name
from agent.ops.watch import LineWatch
from agent.protocol.hlc import Hlc

NAME = "agent forget"
LINE_KEYS = ("paused", "switchover", "history")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "forget",
        help="clear what a decommissioned line or a stopped instance left behind",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("line", metavar="LINE")
    parser.add_argument("instance", nargs="?", metavar="INSTANCE")
    parser.add_argument(
        "--force", action="store_true", help="clear it although an agent is live, or unknown"
    )
    connection_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def check() -> None:
        usable_name(args.line, "line")
        if args.instance is not None:
            usable_name(args.instance, "instance")

    templates = key_templates(args)
    return run_one_shot(args, NAME, lambda client: forget(client, args, templates), check)


def _fail(message: str, code: int) -> int:
    print(f"{NAME}: {message}", file=sys.stderr)
    return code


def _live(row: view.InstanceRow, holder: str | None) -> str | None:
    """How an instance is live, or None."""
    if row.instance == holder:
        return f"{row.instance} holds the lock"
    if row.up:
        return f"{row.instance} is {row.role}, heard {view.age(row.heartbeat_age_s)} ago"
    return None


async def forget(
    client: StateStoreClient, args: argparse.Namespace, templates: KeyTemplates
) -> int:
    line, keys, health = args.line, templates.keys, templates.health
    retained = Retained(client.session)
    known = await reported(retained, templates)
    if line not in known.lines and not args.force:
        return _fail(
            f"{unknown(line, Reported(known.lines))}; --force to clear it anyway", EXIT_UNKNOWN
        )
    watch = LineWatch(client, retained, keys, health, line)
    await watch.start()
    snapshot = await watch.read()
    report = view.assess(snapshot, time.time())
    rows = {r.instance: r for r in report.instances}
    if args.instance is not None:
        row = rows.get(args.instance)
        if row is None and not args.force:
            close = suggestions(args.instance, rows)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            return _fail(
                f"no instance {args.instance} of line {line} has reported{hint}; --force to "
                "clear it anyway",
                EXIT_UNKNOWN,
            )
        live = None if row is None else _live(row, report.holder)
        if live is not None and not args.force:
            return _fail(f"{live}: stop it first (or --force)", EXIT_NOT_APPLIED)
        await _clear(client, health.instance_topic(line, args.instance))
        print(f"forgot instance {args.instance} of line {line}: its retained health is cleared")
        return EXIT_OK

    live_rows = [s for s in (_live(r, report.holder) for r in report.instances) if s]
    if live_rows and not args.force:
        shown = "; ".join(live_rows)
        return _fail(
            f"line {line} has live agents ({shown}): stop them first (or --force)",
            EXIT_NOT_APPLIED,
        )
    topics = [health.instance_topic(line, name) for name in rows]
    devices = [
        device
        for device in snapshot.device_ids()
        if (snapshot.devices[device].status or {}).get("line") in (None, line)
    ]
    for device in devices:
        topics += [
            health.device_status_topic(device, line),
            health.device_availability_topic(device, line),
            templates.telemetry.topic.format(device=device, line=line),
        ]
    topics.append(templates.telemetry.line_topic.format(line=line, device=line))
    for topic in topics:
        await _clear(client, topic)
    fence = Hlc(time.time_ns() // 1_000_000, 0, "agent-forget")
    removed = 0
    for name in LINE_KEYS:
        removed += await client.delete(keys.of_line(name, line), fencing_token=fence)
    kept = ""
    if report.holder is None:
        removed += await client.delete(keys.of_line("lock", line), fencing_token=fence)
    else:
        kept = f"; its lock is kept: {report.holder} holds it"
    for device in snapshot.device_ids():
        key = keys.of("line", device=device, line=line)
        removed += max(0, await client.vdelete(key, line, fencing_token=fence))
    print(
        f"forgot line {line}: the retained health of {len(rows)} instance(s) and the status "
        f"of {len(devices)} device(s) cleared, {removed} key(s) deleted (set points and sync "
        f"records kept){kept}"
    )
    return EXIT_OK


async def _clear(client: StateStoreClient, topic: str) -> None:
    """A retained message is cleared by an empty one."""
    await client.session.publish(topic, b"", qos=1, retain=True)
