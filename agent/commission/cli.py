"""`agent scan PORT`: a bus scan that commissions a line.

Finds the units on a port (a device path, or a serial device server's socket:// or
rfc2217:// URL, as AGENT_SERIAL__URL takes), speaking the line protocol or Modbus RTU
(--protocol), at the addresses given (--addresses, 1-247 by default) and at each of the
line's settings given (--baud and --parity take lists: each is tried). For each unit found
it prints the address, what the unit says of itself, which of the profile's points it
answers, and its reply time; then the collisions (two units at one address: garbage every
time), the noise, and how long the sweep took beside the line's physical floor. With
--output it writes a devices file for the units found (the profile --profile, ids
`<line>-<address>`), which `agent --print-config` takes as it is.

A dead address costs one reply timeout: twice a typical turnaround (5 ms) and the reply's
line time, at least 50 ms (--reply-timeout-ms for slower units: the line protocol lets a
unit take 200 ms).

It never touches a line an agent drives: with --line-id it reads the line's lock in the
store (the connection settings of `agent store`) and refuses while an agent holds it,
unless the line is paused (`agent pause LINE`); without a store to ask, --no-store. It
refuses a local port that another process has open or locked, or that an agent on this
gateway has claimed (unless the store says the line is paused).

Exit codes: 0 units found, 1 none found, 2 usage, 4 the store or the port cannot be
reached, 5 units found and a collision, 8 the line is driven by an agent, 9 the port is in
use.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.client.cli import (
    EXIT_CONNECTION,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    connection_options,
    run_one_shot,
)
from agent.client.lock import holder_instance
from agent.client.statestore import StateStoreClient
from agent.commission import devices_file
from agent.commission.scan import PortBusy, check_port_free, scan
from agent.commission.sweep import Found, Protocol, Settings, SweepResult
from agent.config.line import check_id
from agent.config.profiles import BUILT_IN, read_profiles_file
from agent.controller import line_protocol as lp
from agent.controller.driver import LinkLost, PortClaim, PortTaken, is_device_path
from agent.controller.profile import Profile
from agent.ops.control import PauseNote
from agent.ops.keys import KeyTemplates

EXIT_NONE_FOUND = 1
EXIT_COLLISION = 5
EXIT_LINE_DRIVEN = 8
EXIT_PORT_BUSY = 9
NAME = "agent scan"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "scan",
        help="find the units on a port and write the line's devices file",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("url", metavar="PORT", help="a device path or a socket:// URL")
    parser.add_argument("--protocol", choices=("line", "modbus"), default="line")
    parser.add_argument("--addresses", default="1-247", metavar="LIST", help="e.g. 1-32,40 (1-247)")
    parser.add_argument(
        "--baud", default="", metavar="LIST", help="baud rates to try (9600; Modbus 19200)"
    )
    parser.add_argument(
        "--parity", default="", metavar="LIST", help="parities to try: N, E, O (N; Modbus E)"
    )
    parser.add_argument("--profile", help="the units' profile: its points are probed")
    parser.add_argument(
        "--profiles-file", type=Path, help="where --profile is defined, if not built in"
    )
    parser.add_argument(
        "--line-id",
        dest="line",  # as the other commands name it: its env file gives the connection
        help="the line (its lock is checked; the devices' ids)",
    )
    parser.add_argument("--output", type=Path, metavar="FILE", help="write the devices file")
    parser.add_argument(
        "--reply-timeout-ms", type=float, metavar="MS", help="the wait for a reply's first byte"
    )
    parser.add_argument(
        "--lock-dir",
        type=Path,
        default=Path(os.environ.get("AGENT_SERIAL__LOCK_DIR") or "/run/lock"),
        help="where agents claim local ports (AGENT_SERIAL__LOCK_DIR, /run/lock)",
    )
    parser.add_argument(
        "--no-store", action="store_true", help="do not ask the store (a line no agent serves)"
    )
    connection_options(parser)
    parser.set_defaults(func=run)


@dataclass(frozen=True, slots=True)
class Plan:
    protocol: Protocol
    addresses: list[int]
    settings: list[Settings]
    profile: Profile | None
    definition: dict[str, object] | None
    reply_timeout_s: float | None


def plan(args: argparse.Namespace) -> Plan:
    """The scan the arguments ask for (UsageError saying what is wrong)."""
    protocol: Protocol = args.protocol
    try:
        addresses = sorted(lp.parse_addresses(args.addresses))
    except ValueError as exc:
        raise UsageError(f"--addresses: {exc}") from None
    bauds = _list(args.baud or ("19200" if protocol == "modbus" else "9600"), "--baud")
    try:
        rates = [int(b) for b in bauds]
    except ValueError:
        raise UsageError(f"--baud: not a baud rate in {args.baud!r}") from None
    if any(rate <= 0 for rate in rates):
        raise UsageError("--baud: a baud rate is positive")
    parities = [
        p.upper() for p in _list(args.parity or ("E" if protocol == "modbus" else "N"), "--parity")
    ]
    if any(p not in ("N", "E", "O") for p in parities):
        raise UsageError(f"--parity: N, E or O, not {args.parity!r}")
    settings = [Settings(b, p) for b, p in itertools.product(rates, parities)]
    if args.reply_timeout_ms is not None and not args.reply_timeout_ms > 0:
        raise UsageError("--reply-timeout-ms must be > 0")
    if args.line is not None:
        try:
            check_id(args.line)
        except ValueError as exc:
            raise UsageError(f"--line-id: {exc}") from None
    elif not args.no_store:
        raise UsageError("--line-id names the line whose lock is checked (or --no-store)")
    if args.output is not None and args.line is None:
        raise UsageError("--output needs --line-id: the devices' ids are named after the line")
    profile, definition = _profile(args, protocol)
    timeout = None if args.reply_timeout_ms is None else args.reply_timeout_ms / 1000
    return Plan(protocol, addresses, settings, profile, definition, timeout)


def _list(text: str, flag: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise UsageError(f"{flag}: give at least one")
    return items


def _profile(
    args: argparse.Namespace, protocol: Protocol
) -> tuple[Profile | None, dict[str, object] | None]:
    if args.profile is None:
        if args.profiles_file is not None:
            raise UsageError("--profiles-file without --profile")
        return None, None
    definition: dict[str, object] | None = None
    if args.profile in BUILT_IN:
        profile = BUILT_IN[args.profile]
    elif args.profiles_file is None:
        raise UsageError(
            f"--profile {args.profile}: not built in ({', '.join(BUILT_IN)}): give --profiles-file"
        )
    else:
        try:
            profiles = read_profiles_file(args.profiles_file)
            raw = json.loads(args.profiles_file.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"--profiles-file {args.profiles_file}: {exc}") from None
        if args.profile not in profiles:
            raise UsageError(f"--profile {args.profile}: not in {args.profiles_file}")
        profile = profiles[args.profile]
        definition = (raw.get("profiles", raw) if isinstance(raw, dict) else {})[args.profile]
    if (profile.modbus if protocol == "modbus" else profile.line) is None:
        raise UsageError(f"--profile {args.profile}: not for the {protocol} protocol")
    return profile, definition


# --- the line's owner ---------------------------------------------------------------------


@dataclass(slots=True)
class LineState:
    holder: str | None = None
    paused: str | None = None


async def read_line(client: StateStoreClient, line: str, state: LineState) -> int:
    """Who holds the line's lock and whether it is paused: EXIT_LINE_DRIVEN when an agent
    drives it."""
    keys = KeyTemplates().keys
    holder, _ = await client.get(keys.lock.format(line=line, device=line))
    paused, _ = await client.get(keys.of_line("paused", line))
    state.holder = None if holder is None else holder_instance(holder)
    state.paused = None if paused is None else PauseNote.parse(paused).describe()
    if state.holder is not None and state.paused is None:
        print(
            f"{NAME}: line {line} is driven by agent instance {state.holder} (it holds "
            f"the line's lock): pause it first with `agent pause {line}`, then scan",
            file=sys.stderr,
        )
        return EXIT_LINE_DRIVEN
    return EXIT_OK


# --- the scan -----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    state = LineState()
    if args.no_store:
        try:
            wanted = plan(args)
        except UsageError as exc:
            print(f"{NAME}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    else:
        checked: list[Plan] = []

        def check() -> None:
            checked.append(plan(args))

        code = run_one_shot(args, NAME, lambda c: read_line(c, args.line, state), check)
        if code != EXIT_OK:
            return code
        wanted = checked[0]
        if state.paused is not None:
            print(f"line {args.line} is paused ({state.paused}): scanning it")
    claim = PortClaim(args.url, args.lock_dir) if is_device_path(args.url) else None
    try:
        if claim is not None:
            try:
                claim.take()
            except PortTaken as exc:
                if state.paused is None:
                    raise PortBusy(f"{exc}: pause its line (`agent pause`) first") from None
                claim = None  # its agent has paused the line: it keeps the claim, not the port
            except OSError:
                claim = None  # no lock directory here: nobody claims ports in it
        check_port_free(args.url)
        return _scan(args, wanted)
    except PortBusy as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return EXIT_PORT_BUSY
    except LinkLost as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return EXIT_CONNECTION
    finally:
        if claim is not None:
            claim.release()


def _scan(args: argparse.Namespace, wanted: Plan) -> int:
    settings = wanted.settings
    if args.url.startswith("socket://") and len(settings) > 1:
        print(
            f"{args.url}: the serial device server sets the line's baud rate and parity, "
            f"which a socket:// URL cannot change: scanning once, timed for {settings[0]}"
        )
        settings = settings[:1]
    results: list[SweepResult] = []
    span = f"{wanted.addresses[0]}..{wanted.addresses[-1]}"
    if len(wanted.addresses) != wanted.addresses[-1] - wanted.addresses[0] + 1:
        span = f"{len(wanted.addresses)} addresses in {span}"
    for setting in settings:
        try:
            result, elapsed, dead_s = scan(
                args.url,
                wanted.protocol,
                wanted.addresses,
                setting,
                wanted.profile,
                wanted.reply_timeout_s,
            )
        except LinkLost as exc:
            print(f"{NAME}: {exc}", file=sys.stderr)
            return EXIT_PORT_BUSY if "lock" in str(exc) else EXIT_CONNECTION
        _report(result, elapsed, dead_s, wanted, span)
        results.append(result)
    best = max(results, key=lambda r: len(r.found))
    if not best.found:
        print("no unit answered")
        return EXIT_NONE_FOUND
    if len(results) > 1:
        print(f"the line's settings: {best.settings} ({len(best.found)} units)")
    if args.output is not None:
        try:
            _write(args, wanted, best)
        except OSError as exc:
            print(f"{NAME}: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
            return EXIT_USAGE
    return EXIT_COLLISION if best.collisions else EXIT_OK


def _report(result: SweepResult, elapsed: float, dead_s: float, wanted: Plan, span: str) -> None:
    profile = wanted.profile
    print(
        f"{result.settings}: {len(result.found)} units at {span} ({wanted.protocol} "
        f"protocol) in {elapsed:.1f} s; the line's floor {result.floor_s:.1f} s "
        f"({result.probes} transactions; a dead address costs "
        f"{dead_s * 1000:.0f} ms of reply timeout)"
    )
    for found in result.found:
        print("  " + _unit_line(found, profile))
    for address in result.collisions:
        print(
            f"  @{address:<4} COLLISION: garbled replies every time: two units at one address; "
            "give one another address"
        )
    for address in result.noisy:
        print(f"  @{address:<4} noise: garbage once, then nothing")
    for address in result.late:
        print(
            f"  @{address:<4} LATE: answered after the reply timeout, so it was asked again "
            "at the end; a unit this slow needs a longer --reply-timeout-ms"
        )
    if result.noise_bytes:
        print(f"  noise on the line: {result.noise_bytes} bytes beside the replies")


def _unit_line(found: Found, profile: Profile | None) -> str:
    named = profile.name if profile is not None else "set point and temperature"
    points = f"{len(found.points)}/{len(found.points) + len(found.missing)} points of {named}"
    if found.missing:
        points += f" (missing: {', '.join(found.missing)})"
    identity = found.identity or "(says nothing of itself)"
    return f"@{found.address:<4} {identity:<40} reply {found.reply_s * 1000:5.1f} ms  {points}"


def _write(args: argparse.Namespace, wanted: Plan, result: SweepResult) -> None:
    addresses = [f.address for f in result.found]
    profile = None if wanted.profile is None else args.profile
    text = devices_file.render(args.line, addresses, profile, wanted.definition)
    temporary = args.output.with_name(args.output.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(args.output)
    setting = result.settings
    print(
        f"wrote {args.output}: {len(addresses)} devices on line {args.line}"
        + (f", profile {profile}" if profile else "")
        + f"; with AGENT_SERIAL__DRIVER={wanted.protocol} AGENT_SERIAL__BAUDRATE="
        f"{setting.baudrate} AGENT_SERIAL__PARITY={setting.parity}"
    )


__all__ = ["register", "run"]
