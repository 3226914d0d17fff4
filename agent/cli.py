"""The `agent` command: dispatches to the subcommands each part of the package registers."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import textwrap
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
    "reload": "agent.runtime.reloading",
}

EXIT_USAGE = 2


class ProseFormatter(argparse.RawDescriptionHelpFormatter):
    """A command's description (its module's docstring) wrapped to the terminal, paragraph
    by paragraph, so that an 80-column terminal never breaks a word; a paragraph with an
    indented line (an example, a list) is kept as it is written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for block in re.split(r"\n[ \t]*\n", text.strip("\n")):
            out: list[str] = []
            prose: list[str] = []
            for line in [*block.splitlines(), None]:
                if line is not None and not line[:1].isspace():
                    prose.append(line.strip())
                    continue
                if prose:
                    out.append(textwrap.fill(" ".join(prose), width, initial_indent=indent,
                                             subsequent_indent=indent))  # fmt: skip
                    prose = []
                if line is not None:
                    out.append(_hanging(indent + line, width))
            paragraphs.append("\n".join(out))
        return "\n\n".join(paragraphs)


def _hanging(line: str, width: int) -> str:
    """An indented line (`  NAME   what it does`) as it is when it fits, else wrapped under
    where its words start (its description's column, when it has one)."""
    if len(line) <= width:
        return line
    column = re.match(r"\s+\S.*?\s{2,}(?=\S)", line)
    hang = column.end() if column and column.end() < width // 2 else len(line) - len(line.lstrip())
    return textwrap.fill(line, width, subsequent_indent=" " * hang)


def _wrapped(parser: argparse.ArgumentParser) -> None:
    """Every parser under this one formats its prose to the terminal."""
    parser.formatter_class = ProseFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _wrapped(child)


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
    _wrapped(parser)
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
