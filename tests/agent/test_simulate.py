"""`agent --simulate` as a newcomer runs it: the hints it prints are run as printed (the
set point and the mode changed in the store and at the front panel), on either protocol,
and every point of the simulated thermostat goes both ways."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.processes import AgentProcess

HINTS_END = re.compile(r"Stop with Ctrl-C\.")
EXPORT = re.compile(r"export AGENT_MQTT__HOST=(\S+) AGENT_MQTT__PORT=(\d+)")
REACHED_THE_STORE = re.compile(r"published mode auto to the store")


def run_hint(line: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A printed command line, run as a shell would run it (`agent` being this checkout's)."""
    command = line.strip()
    if command.startswith("agent "):
        command = f"{sys.executable} -m {command}"
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, env=env, timeout=30, check=False
    )


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
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
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
        commands = [
            h.strip() for h in hints if h.startswith("  agent ") or h.startswith("  printf")
        ]
        remote = [c for c in commands if c.startswith("agent setpoint set")]
        panel = [c for c in commands if c.startswith("printf")]
        read = [c for c in commands if c.startswith("agent setpoint get")]
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
