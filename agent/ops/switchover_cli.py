"""`agent switchover LINE_OR_DEVICE [--to INSTANCE]`: a planned handover, nothing killed.

The command writes the request `<line>\\switchover` naming the lock's current holder (and
the instance to hand over to, if given), with an expiry. The active, which watches that
key, stops driving (a write on the line finishes first), releases the lock and stands aside
for one lease; the named standby, or any standby, takes the lock at once on its DELETE.
The command waits for the new holder, prints how long the handover took, and deletes the
request. If nobody takes over in time (exit 4), the request is withdrawn and the former
active takes the lock back after its grace period.

Refused (exit 1) when nobody holds the lock, when --to names the active itself or an
instance that is not a standby up and ready (its heartbeat), or when no standby is; refused with
exit 7 for a line or device no agent has reported, 2 for one that is not a valid name
(--force to ask anyway, but for an invalid name). Connection settings and the other exit
codes as for `agent store`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import shutil
import socket
import sys
import textwrap
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
from agent.client.lock import holder_instance
from agent.client.statestore import KeyChange, StateStoreClient
from agent.ops import view
from agent.ops.control import SwitchoverRequest, now_iso
from agent.ops.keys import KeyTemplates, key_templates
from agent.ops.names import EXIT_UNKNOWN, UnknownName
from agent.ops.retained import Retained
from agent.ops.target import find, usable_name
from agent.ops.watch import LineWatch

NAME = "agent switchover"
STALE_S = 2.0
"""How long `--to` waits for an instance that still says it is the active, though the lock
says another holds it, to say it is a standby."""


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "switchover",
        help="hand a line over to its standby, nothing killed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", metavar="LINE_OR_DEVICE")
    parser.add_argument("--to", metavar="INSTANCE", help="the standby to hand over to")
    parser.add_argument(
        "--wait",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for the new holder (10); the request expires after it",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="ask even when no standby reports being up, or for a name no agent has reported",
    )
    connection_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def check() -> None:
        if args.wait <= 0:
            raise UsageError("--wait must be positive")
        usable_name(args.target)

    templates = key_templates(args)
    return run_one_shot(args, NAME, lambda client: switchover(client, args, templates), check)


def _fail(message: str, code: int = EXIT_NOT_APPLIED) -> int:
    print(f"{NAME}: {message}", file=sys.stderr)
    return code


def _standbys(report: view.Report, holder: str) -> list[str]:
    return [r.instance for r in report.instances if r.instance != holder and r.can_take_over]


async def _word_of_a_former_active(
    watch: LineWatch, retained: Retained, report: view.Report, name: str, wait_s: float
) -> view.Report:
    """The line once `name` no longer says it is the active (STALE_S at most, `wait_s` if
    shorter): an instance that says so while the lock says another holds it has handed the
    line over a moment ago (a switchover just before this one), and its word as a standby
    is on its way. The line is read again at each word of its own, not at every message."""
    topic = watch.health.instance_topic(watch.line, name)
    heard = asyncio.Event()
    retained.on_message(lambda message: heard.set() if message.topic == topic else None)
    deadline = time.monotonic() + min(wait_s, STALE_S)
    while any(
        r.instance == name and r.up and r.role == "active, no lock" for r in report.instances
    ):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left):
                await heard.wait()
        heard.clear()
        report = view.assess(await watch.read(), time.time())
    return report


async def switchover(
    client: StateStoreClient, args: argparse.Namespace, templates: KeyTemplates
) -> int:
    keys = templates.keys
    retained = Retained(client.session)
    try:
        target = await find(client, retained, templates, args.target, force=args.force)
    except UnknownName as exc:
        return _fail(f"{exc}; --force to ask anyway", EXIT_UNKNOWN)
    line = target.line
    watch = LineWatch(client, retained, keys, templates.health, line, target.device)
    await watch.start()
    report = view.assess(await watch.read(), time.time())
    if report.holder is None:
        return _fail(f"nobody holds the lock of line {line}: no active to hand over from")
    old = report.holder
    if args.to == old:
        return _fail(f"{old} is already the active of line {line}")
    standbys = _standbys(report, old)
    if args.to is not None and args.to not in standbys and not args.force:
        report = await _word_of_a_former_active(watch, retained, report, args.to, args.wait)
        if report.holder != old:
            return _fail(f"the lock of line {line} changed hands meanwhile: try again")
        standbys = _standbys(report, old)
    if args.to is not None and args.to not in standbys and not args.force:
        shown = ", ".join(standbys) or "none"
        return _fail(f"{args.to} is not a standby that is up (standbys up: {shown})")
    if not standbys and not args.force:
        return _fail(f"line {line} has no standby up to hand over to (--force to ask anyway)")

    lock_key = keys.of_line("lock", line)
    request_key = keys.of_line("switchover", line)
    released: list[float] = []
    taken: asyncio.Future[tuple[float, str]] = asyncio.get_running_loop().create_future()

    def on_lock(change: KeyChange) -> None:
        now = time.monotonic()
        if change.kind == "DELETE" and not change.synthetic:
            released.append(now)
        elif change.kind == "SET" and change.value is not None and not taken.done():
            holder = holder_instance(change.value)
            if holder != old:
                taken.set_result((now, str(change.version)))

    holder_value, _ = await client.observe(lock_key, on_lock)
    if holder_value is None or holder_instance(holder_value) != old:
        return _fail(f"the lock of line {line} changed hands meanwhile: try again")
    request = SwitchoverRequest(
        holder=holder_value.decode(errors="replace"),
        to=args.to,
        by=f"{getpass.getuser()}@{socket.gethostname()}",
        at=now_iso(),
    )
    payload = request.encode()
    started = time.monotonic()
    await client.set(request_key, payload, expiry_ms=int(args.wait * 1000))
    try:
        async with asyncio.timeout(args.wait):
            at, token = await taken
    except TimeoutError:
        await client.vdelete(request_key, payload)
        return _fail(
            f"nobody took over line {line} within {args.wait:g} s; the request is withdrawn",
            EXIT_CONNECTION,
        )
    await client.vdelete(request_key, payload)
    await client.unobserve(lock_key)
    new, _ = await client.get(lock_key)
    successor = holder_instance(new) if new is not None else "?"
    if args.to is not None and successor != args.to:
        return _fail(f"{successor} took over line {line}, not {args.to}")
    detail = ""
    if released:
        gap = (at - released[0]) * 1000
        detail = f"; released after {(released[0] - started) * 1000:.0f} ms, "
        detail += f"taken {gap:.0f} ms later"
    said = (
        f"switched over line {line} from {old} to {successor} in "
        f"{(at - started) * 1000:.0f} ms{detail} (fencing token {token})"
    )
    print(textwrap.fill(said, shutil.get_terminal_size().columns, subsequent_indent="  "))
    return EXIT_OK
