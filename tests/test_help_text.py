"""Every command's help in an 80x24 terminal: no line wider than the terminal, so that it
never breaks a word where the terminal wraps it."""

from __future__ import annotations

import pytest

import agent.cli
from tests.support.terminal import COLUMNS, run

COMMANDS = [[], *([name] for name in agent.cli.SUBCOMMANDS), ["store", "get"], ["setpoint", "set"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "agent")
def test_help_fits_an_80_column_terminal(command: list[str]) -> None:
    shown = run([*command, "--help"]).splitlines()
    assert len(shown) > 5, shown
    wide = [line for line in shown if len(line) > COLUMNS]
    assert wide == [], "\n".join(wide)
