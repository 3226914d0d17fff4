"""`agent sim-device`: run the fake controller until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from agent.controller.fake_device import FakeDevice
from agent.controller.interface import DEFAULT_LIMITS, Limits

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sim-device",
        help="run a fake controller (line protocol, thermal model) on a pty and/or TCP",
        description="Run a fake controller speaking the line protocol over a thermal "
        "model. Prints one ready line naming its endpoints, e.g. "
        "'device socket://127.0.0.1:40001 panel tcp://127.0.0.1:40002', and runs until "
        "SIGINT or SIGTERM. Without --pty or --tcp it serves TCP on a free port.",
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
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
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
        help="delay replies by the line time of a serial line at this baud rate",
    )
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING, ...")
    parser.set_defaults(func=run)


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
    tcp = args.tcp if args.tcp is not None or args.pty is not None else 0
    device = FakeDevice(
        setpoint=args.setpoint,
        temperature=args.temperature,
        limits=limits,
        time_constant_s=args.time_constant,
        host=args.host,
        emulate_baud=args.emulate_baud,
    )
    async with device:
        await device.start(pty_link=args.pty, tcp_port=tcp, panel_port=args.panel)
        print(device.ready_line(), flush=True)
        await stop.wait()
        log.info("sim-device: stopping")
    return 0
