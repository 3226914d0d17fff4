"""`agent watch [LINE_OR_DEVICE]`: what the agents publish, as it comes, without
mosquitto-clients (like `tedge mqtt sub`): each instance's health, each device's status,
availability and telemetry, and the line's telemetry, one message a line:

    [agents/floor3/gw1/health] {"status":"up","role":"active",...}

Without an argument, every line's; a device narrows it to that device (and its line's
health). The retained messages come first (the last word of each topic), then every new
one, until Ctrl-C (exit 0) or `--count` messages. `--kind` keeps some kinds only (health,
status, availability, telemetry; repeatable); a payload longer than `--max-bytes` is cut
(its length said). A name no agent has reported is refused (exit 7; --force to watch it
anyway), an invalid one is exit 2; connection settings and the other codes as for `agent
store`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from agent.client.cli import EXIT_OK, UsageError, connection_options, run_one_shot
from agent.client.statestore import StateStoreClient
from agent.message import Message
from agent.ops.keys import KeyTemplates, key_templates
from agent.ops.names import EXIT_UNKNOWN, UnknownName
from agent.ops.retained import Retained
from agent.ops.target import find, reported, usable_name

NAME = "agent watch"
KINDS = ("health", "status", "availability", "telemetry")
MAX_BYTES = 1000
_ESCAPED = {code: f"\\x{code:02x}" for code in (*range(32), 127)} | {
    9: "\\t",
    10: "\\n",
    13: "\\r",
}
"""Control characters, shown escaped: a message stays on its line."""


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "watch",
        help="follow the agents' health, device statuses and telemetry (like tedge mqtt sub)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", nargs="?", metavar="LINE_OR_DEVICE")
    parser.add_argument(
        "--kind", action="append", choices=KINDS, help="only these kinds (repeatable)"
    )
    parser.add_argument("--count", type=int, metavar="N", help="stop after N messages")
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=MAX_BYTES,
        metavar="N",
        help=f"cut a payload longer than N bytes ({MAX_BYTES})",
    )
    parser.add_argument("--force", action="store_true", help="watch a name no agent reported")
    connection_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def check() -> None:
        if args.count is not None and args.count <= 0:
            raise UsageError("--count must be positive")
        if args.max_bytes <= 0:
            raise UsageError("--max-bytes must be positive")
        if args.target is not None:
            usable_name(args.target)

    templates = key_templates(args)
    return run_one_shot(args, NAME, lambda client: watch(client, args, templates), check)


def shown(message: Message, max_bytes: int) -> str:
    """One message on one line: its topic, its payload as text (escaped where it is not,
    newlines included), cut past `max_bytes`."""
    text = message.payload[:max_bytes].decode(errors="backslashreplace").translate(_ESCAPED)
    if len(message.payload) > max_bytes:
        text += f"… ({len(message.payload)} bytes)"
    return f"[{message.topic}] {text}"


def topic_filters(
    templates: KeyTemplates,
    kinds: list[str],
    line: str | None,
    devices: list[str] | None,
    *,
    one_device: bool = False,
) -> list[str]:
    """What to subscribe to: every line's and device's (`+`), or a line's and its devices'
    (`one_device`: a device's, and its line's health)."""
    health, telemetry = templates.health, templates.telemetry
    where = line or "+"
    filters: list[str] = []
    if "health" in kinds:
        filters.append(health.topic.format(line=where, instance="+", device=where))
    for device in ["+"] if devices is None else devices:
        if "status" in kinds:
            filters.append(health.device_status_topic(device, where))
        if "availability" in kinds:
            filters.append(health.device_availability_topic(device, where))
        if "telemetry" in kinds:
            filters.append(telemetry.topic.format(device=device, line=where))
    if "telemetry" in kinds and not one_device:
        filters.append(telemetry.line_topic.format(line=where, device=where))
    return list(dict.fromkeys(filters))


async def watch(client: StateStoreClient, args: argparse.Namespace, templates: KeyTemplates) -> int:
    line: str | None = None
    devices: list[str] | None = None
    if args.target is not None:
        retained = Retained(client.session)
        try:
            target = await find(client, retained, templates, args.target, force=args.force)
        except UnknownName as exc:
            print(f"{NAME}: {exc}; --force to watch it anyway", file=sys.stderr)
            return EXIT_UNKNOWN
        line = target.line
        known = await reported(retained, templates)
        devices = (
            [target.device]
            if target.device is not None
            else sorted(d for d, at in known.devices.items() if at == line)
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    seen = 0

    def take(message: Message) -> None:
        nonlocal seen
        if stop.is_set():
            return
        try:
            print(shown(message, args.max_bytes), flush=True)
        except BrokenPipeError:  # the reader went away (`| head`): done
            stop.set()
            return
        seen += 1
        if args.count is not None and seen >= args.count:
            stop.set()

    def lost() -> None:
        if not stop.is_set():
            print(f"{NAME}: the broker is unreachable; reconnecting", file=sys.stderr)

    async def back() -> None:
        print(f"{NAME}: connected again", file=sys.stderr)

    session = client.session
    session.on_disconnect(lost)
    session.on_connect(back)
    kinds = args.kind or list(KINDS)
    one_device = args.target is not None and devices == [args.target] and line != args.target
    for topic_filter in topic_filters(templates, kinds, line, devices, one_device=one_device):
        await session.subscribe(topic_filter, take)
    await stop.wait()
    return EXIT_OK
