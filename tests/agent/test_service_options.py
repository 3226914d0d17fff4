"""The running agent's own command line, which only the command writes (agent.runtime.handover)
and which a person who starts the module by hand gets a clear answer for."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent.runtime.exits import EXIT_CONFIG
from agent.runtime.service import options


def test_options_in_both_spellings() -> None:
    given = options(["--settings-fd", "5", "--line=t-1", "--instance", "a"])
    assert given == {"--settings-fd": "5", "--line": "t-1", "--instance": "a"}


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--settings"], "unknown option '--settings'"),
        (["--settings-fd"], "--settings-fd needs a value"),
        (["--line="], "--line needs a value"),
        (["5"], "unknown option '5'"),
    ],
)
def test_a_wrong_option_is_named(argv: list[str], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        options(argv)


@pytest.mark.parametrize("argv", [[], ["--settings-fd", "x"], ["--settings-fd", "999"]])
def test_started_by_hand_it_says_how_to_start_the_agent(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent.runtime.service", *argv],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == EXIT_CONFIG
    assert "no settings handed over" in done.stderr and "start it as `agent`" in done.stderr
    assert "Traceback" not in done.stderr
