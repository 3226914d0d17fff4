"""`agent setpoint`: a device's set point, read or written knowing only the device.

`agent setpoint set floor3-t07 22.5` finds the device's line (`<device>\\line`), fences the
write with the line's lock (`<line>\\lock`), and with `--wait` waits until the active has
applied it (its sync record shows the write's version). Connection settings as for
`agent store`. Exit codes: 0 done, 1 no agent serves the device (or nobody is active),
2 usage, 3 service error (refused), 4 connection failure or timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from agent.client.cli import (
    EXIT_CONNECTION,
    EXIT_NOT_APPLIED,
    EXIT_OK,
    UsageError,
    connection_options,
    run_one_shot,
)
from agent.client.statestore import KeyChange, StateStoreClient
from agent.ops.keys import KeyTemplates, NoActive, NoLine, fenced_set, find
from agent.sync.decisions import InvalidRemoteValue, parse_setpoint
from agent.sync.record import InvalidRecord, parse_record

NAME = "agent setpoint"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "setpoint",
        help="read or write a device's set point, knowing only the device",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    connection_options(parser)
    shared = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    connection_options(shared, defaults=False)
    commands = parser.add_subparsers(dest="setpoint_command", metavar="COMMAND", required=True)
    get = commands.add_parser("get", parents=[shared], help="print the set point in the store")
    get.add_argument("device")
    get.set_defaults(setpoint_func=_get)
    set_ = commands.add_parser(
        "set", parents=[shared], help="write the set point, fenced with the line's lock"
    )
    set_.add_argument("device")
    set_.add_argument("value", help="degrees Celsius, a decimal number such as 22.5")
    set_.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait until the active agent has applied it (exit 4 if not within SECONDS)",
    )
    set_.set_defaults(setpoint_func=_set)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def check() -> None:
        if args.setpoint_command == "set":
            try:
                parse_setpoint(args.value.encode())
            except InvalidRemoteValue as exc:
                raise UsageError(str(exc)) from None

    keys = KeyTemplates().keys
    return run_one_shot(args, NAME, lambda c: args.setpoint_func(c, args, keys), check)


async def _get(client: StateStoreClient, args: argparse.Namespace, keys: Any) -> int:
    try:
        found = await find(client, args.device, keys)
    except NoLine as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return EXIT_NOT_APPLIED
    value, _ = await client.get(found.setpoint)
    if value is None:
        return EXIT_NOT_APPLIED
    print(value.decode(errors="backslashreplace"))
    return EXIT_OK


async def _set(client: StateStoreClient, args: argparse.Namespace, keys: Any) -> int:
    try:
        found = await find(client, args.device, keys)
    except NoLine as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return EXIT_NOT_APPLIED
    applied = asyncio.Event()
    wanted: list[Any] = []

    def on_record(change: KeyChange) -> None:
        if change.value is None or not wanted:
            return
        try:
            record = parse_record(change.value)
        except InvalidRecord:
            return
        if record.version is not None and record.version >= wanted[0]:
            applied.set()

    if args.wait > 0:
        await client.observe(found.synced, on_record)
    try:
        result, _ = await fenced_set(client, found, args.value.encode())
    except NoActive as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return EXIT_NOT_APPLIED
    print(result.version)
    if args.wait <= 0:
        return EXIT_OK
    wanted.append(result.version)
    record, _ = await client.get(found.synced)
    if record is not None:
        on_record(KeyChange(found.synced.encode(), "SET", record, None))
    try:
        async with asyncio.timeout(args.wait):
            await applied.wait()
    except TimeoutError:
        print(f"{NAME}: not applied within {args.wait:g} s", file=sys.stderr)
        return EXIT_CONNECTION
    return EXIT_OK
