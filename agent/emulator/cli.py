"""`agent emulator`: a local state store for developers and tests."""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from agent import logs


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "emulator",
        help="run a local state store (embedded MQTT 5 broker, or on an external broker)",
        description="Runs an MQTT 5 broker that hosts a local state store. Prints one line "
        "with mqtt://HOST:PORT once it accepts connections, then serves until SIGINT or "
        "SIGTERM.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=1883, help="port to listen on (0: any)")
    parser.add_argument("--quota", type=int, default=None, help="maximum number of keys")
    parser.add_argument(
        "--deny-prefix",
        action="append",
        default=[],
        metavar="PREFIX",
        help="refuse access to keys starting with PREFIX ('not authorized'); repeatable",
    )
    parser.add_argument(
        "--external",
        metavar="URL",
        help="instead of embedding a broker, serve as a client of the broker at URL "
        "(mqtt://HOST:PORT); see the README for what this mode can see",
    )
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING, ERROR")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    if args.quota is not None and args.quota < 1:
        print("agent emulator: --quota must be at least 1")
        return 2
    return asyncio.run(_serve(args))


def _authorizer(prefixes: list[str]) -> Any:
    if not prefixes:
        return None
    denied = tuple(p.encode() for p in prefixes)
    return lambda client_id, key, access: not key.startswith(denied)


async def _serve(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    authorizer = _authorizer(args.deny_prefix)
    if args.external:
        from agent.emulator.external import ExternalStateStore

        service: Any = ExternalStateStore(args.external, quota=args.quota, authorizer=authorizer)
    else:
        from agent.emulator.embedded import EmbeddedStateStore

        service = EmbeddedStateStore(args.host, args.port, quota=args.quota, authorizer=authorizer)
    await service.start()
    print(f"state store ready at {service.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await service.stop()
    return 0
