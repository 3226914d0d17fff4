"""`agent setpoint`: a device's set point (or another of its points), read or written
knowing only the device.

`agent setpoint set floor3-t07 22.5` finds the device's line (`<device>\\line`), checks the
value against the unit's limits when the active has published them (in the device's sync
record), fences the write with the line's lock (`<line>\\lock`), and with `--wait` waits
until the active has applied it (its sync record shows the write's version) or refused it
(the record says why). `--point mode` (or heatSetPoint, coolSetPoint, fan, occupied) writes
another point of a unit with a profile; `heatSetPoint=25 coolSetPoint=27` writes several
points of the device in one command (a heating and a cooling set point so written are
judged as one change: both go, or both are refused). A device no agent has reported is refused, with
close matches (--force to try it anyway). Connection settings as for `agent store`. Exit
codes: 0 done, 1 no agent serves the device (or nobody is active), 2 usage (a device name
the agent would not take included), 3 service error, 4 connection failure or timeout,
5 refused: the unit cannot take the value (its limits, its choices, the deadband between
heating and cooling), said with why, 7 a device no agent has reported. With --wait, a value
not applied is said with why, and stays in the store to be applied when that ends: 6 the
line is paused (by whom, when, why), 8 the unit does not answer or the active is down, 1
nobody is active; 4 when none of these is seen and the time is up.
"""

from __future__ import annotations

import argparse
import asyncio
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
from agent.client.shown import show_value
from agent.client.statestore import KeyChange, StateStoreClient
from agent.controller import points
from agent.controller.interface import PointValue
from agent.controller.points import WRITABLE, InvalidValue
from agent.ops import target, view
from agent.ops.keys import (
    DeviceKeys,
    KeyTemplates,
    NoActive,
    NoLine,
    fenced_set,
    find,
    key_templates,
)
from agent.ops.names import EXIT_UNKNOWN, UnknownName
from agent.ops.pending import EXIT_PAUSED, Pending, why_pending
from agent.ops.retained import Retained
from agent.ops.target import usable_name
from agent.ops.watch import LineWatch
from agent.protocol.hlc import Hlc
from agent.sync.record import InvalidRecord, SyncRecord, parse_full_record

NAME = "agent setpoint"
EXIT_REFUSED = 5


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "setpoint",
        help="read or write a device's set point (or another point), knowing only the device",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    connection_options(parser)
    shared = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    connection_options(shared, defaults=False)
    point = argparse.ArgumentParser(add_help=False)
    point.add_argument(
        "--point",
        default="setPoint",
        choices=WRITABLE,
        metavar="POINT",
        help=f"which point: {', '.join(WRITABLE)} (default setPoint; the others need a unit "
        "with a profile)",
    )
    point.add_argument("--force", action="store_true", help="try a device no agent has reported")
    commands = parser.add_subparsers(dest="setpoint_command", metavar="COMMAND", required=True)
    get = commands.add_parser("get", parents=[shared, point], help="print the value in the store")
    get.add_argument("device")
    get.set_defaults(setpoint_func=_get)
    set_ = commands.add_parser(
        "set", parents=[shared, point], help="write the value, fenced with the line's lock"
    )
    set_.add_argument("device")
    set_.add_argument(
        "value",
        nargs="+",
        help="a set point in degrees Celsius (22.5); a mode (off, heat, cool, auto, fan); a "
        "fan speed (auto, on, low, medium, high); occupied: true or false. Several points "
        "at once as POINT=VALUE (heatSetPoint=25 coolSetPoint=27): written together, "
        "judged by the agent as one change",
    )
    set_.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait until the active agent has applied it (5 if the unit refused it; not "
        "applied, said why: 6 the line is paused, 8 the unit or the active is down, 1 nobody "
        "is active, 4 none of these within SECONDS)",
    )
    set_.set_defaults(setpoint_func=_set)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    def check() -> None:
        usable_name(args.device, "device")
        if args.setpoint_command == "set":
            args.values = _values(args.value, args.point)

    templates = key_templates(args)

    async def work(client: StateStoreClient) -> int:
        # One for the command: a second would not get the retained messages this one has.
        retained = Retained(client.session)
        try:
            await target.find(
                client,
                retained,
                templates,
                args.device,
                force=args.force,
                devices_only=True,
            )
        except UnknownName as exc:
            print(f"{NAME}: {exc}; --force to try it anyway", file=sys.stderr)
            return EXIT_UNKNOWN
        code: int = await args.setpoint_func(client, args, templates, retained)
        return code

    return run_one_shot(args, NAME, work, check)


def _key(found: DeviceKeys, point: str, keys: Any) -> str:
    return (
        found.setpoint
        if point == "setPoint"
        else keys.of_point(point, device=found.device, line=found.line)
    )


async def _get(
    client: StateStoreClient, args: argparse.Namespace, templates: KeyTemplates, _: Retained
) -> int:
    keys = templates.keys
    try:
        found = await find(client, args.device, keys)
    except NoLine as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return EXIT_NOT_APPLIED
    value, _ = await client.get(_key(found, args.point, keys))
    if value is None:
        return EXIT_NOT_APPLIED
    print(show_value(value))
    return EXIT_OK


async def _record(client: StateStoreClient, found: DeviceKeys) -> SyncRecord | None:
    raw, _ = await client.get(found.synced)
    if raw is None:
        return None
    try:
        return parse_full_record(raw)
    except InvalidRecord:
        return None


def _values(given: list[str], default_point: str) -> list[tuple[points.Point, PointValue]]:
    """The points to write and their values: one VALUE (of --point), or POINT=VALUE each."""
    if len(given) == 1 and "=" not in given[0]:
        given = [f"{default_point}={given[0]}"]
    values: dict[str, tuple[points.Point, PointValue]] = {}
    for word in given:
        name, equals, text = word.partition("=")
        if not equals:
            raise UsageError(f"{word!r}: with several values, give each as POINT=VALUE")
        if name not in WRITABLE:
            raise UsageError(f"{name!r} is not a point to write (one of {', '.join(WRITABLE)})")
        if name in values:
            raise UsageError(f"{name} is given twice")
        point = points.point(name)
        try:
            values[name] = (point, points.parse(point, text.encode()))
        except InvalidValue as exc:
            raise UsageError(str(exc)) from None
    return list(values.values())


async def _pending(
    client: StateStoreClient, retained: Retained, templates: KeyTemplates, found: DeviceKeys
) -> Pending | None:
    """What the line's status says keeps the device's value from being applied."""
    watch = LineWatch(client, retained, templates.keys, templates.health, found.line)
    await watch.start()
    return why_pending(view.assess(await watch.read(), time.time()), found.device)


def _not_applied(pending: Pending) -> int:
    print(f"{NAME}: not applied yet: {pending.why}", file=sys.stderr)
    return pending.code


async def _set(
    client: StateStoreClient,
    args: argparse.Namespace,
    templates: KeyTemplates,
    retained: Retained,
) -> int:
    keys = templates.keys
    try:
        found = await find(client, args.device, keys)
    except NoLine as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return EXIT_NOT_APPLIED
    known = await _record(client, found)
    held: dict[str, PointValue] = {}
    for point, value in args.values:
        limits = None if known is None else known.limits.get(point.name)
        held[point.name] = value
        if limits is not None or point.kind is not points.Kind.NUMBER:
            try:
                held[point.name] = points.validate(point, value, limits)
            except InvalidValue as exc:
                # The active published the unit's limits: no need to try what it would
                # refuse.
                print(f"{NAME}: refused: {exc}", file=sys.stderr)
                return EXIT_REFUSED
    loop = asyncio.get_running_loop()
    outcomes: dict[str, asyncio.Future[str | None]] = {
        point.name: loop.create_future() for point, _ in args.values
    }
    wanted: dict[str, Hlc] = {}

    def on_record(change: KeyChange) -> None:
        if change.value is None or not wanted:
            return
        try:
            record = parse_full_record(change.value)
        except InvalidRecord:
            return
        refused = record.refused
        for name, version in wanted.items():
            if outcomes[name].done():
                continue
            if refused is not None and refused.point == name and refused.version == version:
                outcomes[name].set_result(refused.reason)
                continue
            entry = record.point(name)
            synced = None if entry is None else entry.synced.version
            if synced is not None and synced >= version:
                outcomes[name].set_result(None)

    if args.wait > 0:
        await client.observe(found.synced, on_record)
    for point, value in args.values:
        # Back to back: the agent takes a heating and a cooling set point written in one
        # burst for one change (agent.sync.setpoint_pair).
        try:
            key = _key(found, point.name, keys)
            result, _ = await fenced_set(client, found, points.encode(point, value), key=key)
        except NoActive as exc:
            print(f"{NAME}: {exc}", file=sys.stderr)
            return EXIT_NOT_APPLIED
        print(result.version if len(args.values) == 1 else f"{point.name} {result.version}")
        assert result.version is not None
        wanted[point.name] = result.version
        _say_what_the_unit_holds(found, point, value, held[point.name], known)
    if args.wait <= 0:
        return EXIT_OK
    raw, _ = await client.get(found.synced)
    if raw is not None:
        on_record(KeyChange(found.synced.encode(), "SET", raw, None))
    if not all(outcome.done() for outcome in outcomes.values()):
        pending = await _pending(client, retained, templates, found)
        if pending is not None and pending.code == EXIT_PAUSED:
            return _not_applied(pending)  # a pause lasts: no use waiting it out
    try:
        async with asyncio.timeout(args.wait):
            reasons = await asyncio.gather(*outcomes.values())
    except TimeoutError:
        pending = await _pending(client, retained, templates, found)
        if pending is not None:
            return _not_applied(pending)
        late = [name for name, outcome in outcomes.items() if not outcome.done()]
        print(f"{NAME}: {', '.join(late)} not applied within {args.wait:g} s", file=sys.stderr)
        return EXIT_CONNECTION
    for name, reason in zip(outcomes, reasons, strict=True):
        if reason is not None:
            shown = "" if len(outcomes) == 1 else f"{name}: "
            print(f"{NAME}: refused: {shown}{reason}", file=sys.stderr)
    return EXIT_REFUSED if any(reason is not None for reason in reasons) else EXIT_OK


def _say_what_the_unit_holds(
    found: DeviceKeys,
    point: points.Point,
    value: PointValue,
    held: PointValue,
    known: SyncRecord | None,
) -> None:
    """A value off the unit's step: the active rounds it (and logs it); the writer should
    not learn it from the log."""
    limits = None if known is None else known.limits.get(point.name)
    if limits is None or point.kind is not points.Kind.NUMBER or points.same(held, value):
        return
    print(
        f"{NAME}: {found.device} will hold {held:g}, not {value:g}: the unit's "
        f"{point.name} goes in steps of {limits.step:g} from {limits.min:g}",
        file=sys.stderr,
    )
