"""`agent sim-device`: run the fake controller until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from agent.controller import line_protocol as lp
from agent.controller.interface import DEFAULT_LIMITS, Limits
from agent.simulator.core import DEFAULT_RECORD_LIMIT
from agent.simulator.device import FakeDevice
from agent.simulator.line import DEFAULT_TURNAROUND_S, FakeLine

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sim-device",
        help="run a fake controller, or a fake line of them, on a pty and/or TCP",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a fake controller speaking the line protocol over a thermal "
        "model, or with --units N a whole\nmulti-drop line of N of them (addresses 1..N, "
        "addressed mode: '@3 GET SP'), or N Modbus RTU units\n(--modbus). Prints one "
        "ready line naming its endpoints, e.g.\n"
        "'device socket://127.0.0.1:40001 panel tcp://127.0.0.1:40002', and runs until "
        "SIGINT or SIGTERM.\nWithout --pty or --tcp it serves TCP on a free port. The line "
        "is one medium: one transaction\nat a time across all clients and units.",
        epilog=PANEL_HELP,
    )
    parser.add_argument(
        "--pty", metavar="LINK", help="serve on a pseudo-terminal, symlinked at LINK"
    )
    parser.add_argument(
        "--tcp", metavar="PORT", type=_port, help="serve on TCP (0 picks a free port)"
    )
    parser.add_argument(
        "--panel", metavar="PORT", type=_port, help="front panel on TCP (0 picks a free port)"
    )
    parser.add_argument(
        "--rfc2217",
        metavar="PORT",
        type=_port,
        help="serve the line on TCP as an RFC 2217 serial device server too (rfc2217:// URLs)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--units",
        metavar="N",
        type=_units,
        help=f"simulate a multi-drop line: N devices at addresses 1..N ({lp.MIN_ADDRESS}.."
        f"{lp.MAX_ADDRESS}), each its own thermal model, answering only requests with their "
        "own '@<n> ' prefix",
    )
    parser.add_argument(
        "--modbus",
        action="store_true",
        help="the units speak Modbus RTU (unit ids 1..N, default 1 unit) with the Modbus "
        "driver's default register map: set point register 0, temperature 1, tenths, signed; "
        "functions 3/4 read, 6/16 write the set point; and the sim profile's registers: "
        "heating set point 2, cooling 3, mode 4, fan 5, occupied 6, humidity 7",
    )
    parser.add_argument("--setpoint", type=float, default=20.0, help="initial set point, °C")
    parser.add_argument("--temperature", type=float, default=18.0, help="initial temperature, °C")
    parser.add_argument(
        "--time-constant",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how fast the temperature follows the set point",
    )
    parser.add_argument(
        "--limits",
        type=float,
        nargs=3,
        metavar=("MIN", "MAX", "STEP"),
        default=(DEFAULT_LIMITS.min, DEFAULT_LIMITS.max, DEFAULT_LIMITS.step),
    )
    parser.add_argument(
        "--emulate-baud",
        type=int,
        metavar="BAUD",
        help="hold the line for each transaction's line time at this baud rate (10 bits a "
        "byte for the line protocol, 11 for Modbus RTU)",
    )
    parser.add_argument(
        "--turnaround-ms",
        type=float,
        default=DEFAULT_TURNAROUND_S * 1000,
        metavar="MS",
        help="with --emulate-baud: how long each unit takes before it answers "
        "(default %(default)g ms, as real thermostats)",
    )
    parser.add_argument(
        "--records",
        type=_positive,
        default=DEFAULT_RECORD_LIMIT,
        metavar="K",
        help="requests kept in the line's record, and writes kept per unit",
    )
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING, ...")
    parser.set_defaults(func=run)


PANEL_HELP = """\
every unit is a whole thermostat, as the profile `sim` describes it (AGENT_DEVICES='[{"id":
"t01", "address": 1, "profile": "sim"}]'): set point SP, temperature T, heating and cooling
set points H and C (kept 1.0 apart), mode M (OFF HEAT COOL AUTO FAN), fan F (AUTO ON LOW
MEDIUM HIGH), occupied O (1 or 0), humidity RH; 'GET POINTS' reads them all, 'SET H 19.5'
writes one (Modbus: registers 0..7).

front panel (--panel): the line protocol (GET SP, GET STATE, GET POINTS, ...) plus
  PANEL SP <value>        a person changes the set point at the device
  PANEL <point> <value>   ... or another point: PANEL H 19.0, PANEL M COOL, PANEL F LOW,
                          PANEL O 0, PANEL RH 60 (the room's humidity), PANEL T 25
  FAULT UNPLUG <seconds>  the line is unplugged: connections drop, opens fail, then it returns
  FAULT SILENT <seconds>  requests are read but not answered
  FAULT GARBAGE <count>   the next replies are corrupted (Modbus: a bad CRC)
  FAULT SLOW <ms>         replies are delayed
  FAULT SLOWWRITE <ms>    replies to writes only are delayed (an EEPROM that takes its time)
  FAULT LATE <ms>         replies come that late, out of turn: the line is free meanwhile
  FAULT ASADDRESS <n>     replies carry address n (a unit set to the wrong address)
  FAULT STRAY <count>     line noise before the next replies
  FAULT BADSUM <count>    a wrong checksum (CRC) on the next replies
  FAULT NOSUM <count>     no checksum (CRC) on the next replies
  FAULT CLEAR             clears every fault of the line and of its units
With --units, '@<n> ' in front names unit n: '@3 PANEL SP 19.0', '@3 PANEL M COOL',
'@3 GET SP', '@3 FAULT SILENT 10' (faults of that unit only; '@3 FAULT UNPLUG 5': unit 3 is
gone, never answers, for 5 s; '@3 FAULT CLEAR' clears unit 3's faults). FAULT without a
prefix acts on the whole line; device requests and PANEL need one. A unit that does not
exist answers ERR ADDRESS. On a Modbus line the panel speaks the same text protocol.
"""


def _units(text: str) -> int:
    units = int(text)
    if not lp.MIN_ADDRESS <= units <= lp.MAX_ADDRESS:
        raise argparse.ArgumentTypeError(
            f"units must be {lp.MIN_ADDRESS}..{lp.MAX_ADDRESS}, not {text}"
        )
    return units


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text}")
    return port


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        limits = Limits(*args.limits)
        if args.emulate_baud is not None and args.emulate_baud <= 0:
            raise ValueError(f"--emulate-baud must be > 0, not {args.emulate_baud}")
        if args.turnaround_ms < 0:
            raise ValueError(f"--turnaround-ms must be >= 0, not {args.turnaround_ms:g}")
    except ValueError as exc:
        print(f"agent sim-device: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(args, limits))
    except OSError as exc:
        print(f"agent sim-device: {exc}", file=sys.stderr)
        return 1


async def _serve(args: argparse.Namespace, limits: Limits) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    given = (args.tcp, args.pty, args.rfc2217)
    tcp = args.tcp if any(option is not None for option in given) else 0
    options: dict[str, Any] = {
        "setpoint": args.setpoint,
        "temperature": args.temperature,
        "limits": limits,
        "time_constant_s": args.time_constant,
        "host": args.host,
        "emulate_baud": args.emulate_baud,
        "record_limit": args.records,
        "turnaround_s": args.turnaround_ms / 1000,
    }
    device: FakeLine
    if args.units is None and not args.modbus:
        device = FakeDevice(**options)
    else:
        device = FakeLine(args.units or 1, modbus=args.modbus, **options)
    async with device:
        await device.start(
            pty_link=args.pty, tcp_port=tcp, panel_port=args.panel, rfc2217_port=args.rfc2217
        )
        print(device.ready_line(), flush=True)
        await stop.wait()
        log.info("sim-device: stopping")
    return 0
