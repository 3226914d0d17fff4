"""The `agent` command: dispatches to the subcommands each part of the package registers."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each module exposes register(subparsers) (or the function named after a colon); the
# parser it adds sets `func`, which takes the parsed arguments and returns the exit code.
# Imported lazily so one part's import cost or optional dependency never slows or breaks
# another subcommand.
SUBCOMMANDS = {
    "emulator": "agent.emulator.cli",
    "store": "agent.client.cli",
    "sim-device": "agent.simulator.cli",
    "setpoint": "agent.ops.setpoint_cli",
    "status": "agent.ops.status_cli",
    "switchover": "agent.ops.switchover_cli",
    "pause": "agent.ops.pause_cli:register_pause",
    "resume": "agent.ops.pause_cli:register_resume",
    "history": "agent.ops.history_cli",
    "forget": "agent.ops.forget_cli",
    "watch": "agent.ops.watch_cli",
    "scan": "agent.commission.cli",
}

EXIT_USAGE = 2


def build_parser(only: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent",
        description="Keeps a controller's set point in sync with the Azure IoT Operations "
        "state store.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        if name != only:
            subparsers.add_parser(name, help=f"see `agent {name} --help`")
            continue
        module, _, function = module_name.partition(":")
        getattr(importlib.import_module(module), function or "register")(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in args_list if not a.startswith("-")), None)
    if first not in SUBCOMMANDS:
        # No subcommand: the agent itself, whose flags take values (not subcommands).
        from agent.runtime.cli import main as run_agent

        return run_agent(args_list, list(SUBCOMMANDS))
    parser = build_parser(first)
    args = parser.parse_args(args_list)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(func(args))
    except KeyboardInterrupt:
        return 130
