"""`agent --simulate` as a newcomer runs it: the hints it prints are run as printed (the
set point and the mode changed in the store and at the front panel), on either protocol,
and every point of the simulated thermostat goes both ways."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import AgentProcess
from tests.support.terminal import COLUMNS, ROWS, Terminal, screen

CLEAR = "\x1b[2J"
IN_SYNC = re.compile(r"\| yes +\|")

HINTS_END = re.compile(r"Stop with Ctrl-C\.")
EXPORT = re.compile(r"export AGENT_MQTT__HOST=(\S+) AGENT_MQTT__PORT=(\d+)")
REACHED_THE_STORE = re.compile(r"published mode auto to the store")


def not_activated() -> dict[str, str]:
    """A newcomer's other terminal: no AGENT_ settings, and the virtual environment this
    checkout runs in not activated (not on PATH)."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("AGENT_")},
        "PATH": path,
    } | ({} if "VIRTUAL_ENV" not in os.environ else {"VIRTUAL_ENV": ""})


def run_hint(line: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A printed command line, run as a shell would run it, as printed."""
    return subprocess.run(
        ["bash", "-c", line.strip()],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )


def agent_commands(hints: list[str], what: str) -> list[str]:
    return [h.strip() for h in hints if h.startswith("  ") and f" {what} " in h]


@pytest.mark.parametrize(
    ("args", "driver"),
    [
        pytest.param([], "line", id="one-line"),
        # The others differ in what the first covers (the driver, the count): run with -m slow.
        pytest.param([], "modbus", id="one-modbus", marks=pytest.mark.slow),
        pytest.param(["--units", "2"], "line", id="two-line", marks=pytest.mark.slow),
        pytest.param(["--units", "2"], "modbus", id="two-modbus", marks=pytest.mark.slow),
    ],
)
def test_the_printed_hints_change_a_set_point_and_a_mode_both_ways(
    args: list[str], driver: str
) -> None:
    environment = not_activated()
    simulation = AgentProcess(
        ["--simulate", *args],
        env={**environment, "AGENT_SERIAL__DRIVER": driver},
        merge_stderr=True,
    )
    try:
        simulation.wait_for(HINTS_END, timeout=20)
        hints = [line.rstrip("\n") for line in simulation.lines]
        host, port = EXPORT.search("".join(hints)).groups()  # type: ignore[union-attr]
        env = {**environment, "AGENT_MQTT__HOST": host, "AGENT_MQTT__PORT": port}
        remote = agent_commands(hints, "setpoint set")
        panel = [h.strip() for h in hints if h.startswith("  printf")]
        read = agent_commands(hints, "setpoint get")
        assert len(remote) == 2 and "--point mode" in remote[1], hints
        assert len(panel) == 2 and "PANEL M" in panel[1], hints
        assert len(read) == 1, hints
        simulation.wait_for(re.compile("started as active"), timeout=20)
        for command in remote:  # each waits until the agent applied it to the unit
            done = run_hint(command, env)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
        simulation.wait_for(re.compile(r"applied remote mode cool to the controller"))
        for command in panel:
            done = run_hint(command, env)
            assert done.returncode == 0, (command, done.stderr)
        simulation.wait_for(REACHED_THE_STORE, timeout=10)
        got = run_hint(read[0], env)
        assert got.returncode == 0 and got.stdout.strip() == "auto", (got.stdout, got.stderr)
    finally:
        simulation.signal(15)
        assert simulation.proc.wait(15) == 0
        simulation.stop()


@pytest.mark.slow  # an agent started and its view drawn a few times: seconds
def test_the_status_view_fits_80x24_with_the_broker_and_the_commands_to_try() -> None:
    terminal = Terminal(["--simulate", "--status"], env=not_activated())
    try:
        # Drawn once the device is in sync: its agent serves it.
        text = terminal.read_until(lambda t: CLEAR in t and IN_SYNC.search(t.rsplit(CLEAR, 1)[-1]))
        frame = [line for line in screen(text) if line]
        assert len(screen(text)) <= ROWS and max(map(len, frame)) <= COLUMNS, frame
        (store,) = [line for line in frame if line.startswith("state store  mqtt://")]
        port = store.split(":")[-1].split()[0]
        assert f"  export AGENT_MQTT__HOST=127.0.0.1 AGENT_MQTT__PORT={port}" in frame
        (command,) = agent_commands(frame, "setpoint set")
        assert any(line.startswith("  printf 'PANEL SP 23.5") for line in frame), frame
        env = {**not_activated(), "AGENT_MQTT__HOST": "127.0.0.1", "AGENT_MQTT__PORT": port}
        done = run_hint(command, env)
        assert done.returncode == 0, (command, done.stderr)
    finally:
        assert terminal.close() == 0
