"""Operator commands refuse a line or device no agent has reported (a typo pauses nothing
while the technician believes the bus released), and a name the agent would not take."""

from __future__ import annotations

import pytest

from tests.ops.support import command, report
from tests.support.rig import LineRig

LINE = LineRig.LINE
EXIT_USAGE, EXIT_UNKNOWN = 2, 7


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def test_a_typo_pauses_nothing_and_says_what_was_meant(line: LineRig) -> None:
    report(line, LINE, "a", line.device_ids)
    typo = command(line, "pause", "floor03", "--wait", "0")
    assert typo.returncode == EXIT_UNKNOWN
    assert one_line(typo.stderr) == (
        "agent pause: no agent has reported a line or device named floor03 "
        "(did you mean floor3?); --force to pause it anyway"
    )
    assert line.store_value("floor03\\paused") is None
    assert line.store_value(f"{LINE}\\paused") is None

    forced = command(line, "pause", "floor03", "--force", "--wait", "0")
    assert forced.returncode == 0, forced.stderr
    assert line.store_value("floor03\\paused") is not None

    # The line reported, and one of its devices, are what they name.
    assert command(line, "pause", "t02", "--wait", "0").returncode == 0
    assert line.store_value(f"{LINE}\\paused") is not None
    resumed = command(line, "resume", "floor-3")
    assert resumed.returncode == EXIT_UNKNOWN and "(did you mean floor3?)" in resumed.stderr
    assert line.store_value(f"{LINE}\\paused") is not None


def test_status_of_a_typo_says_what_was_meant_not_an_outage(line: LineRig) -> None:
    report(line, LINE, "a", line.device_ids)
    typo = command(line, "status", "flor3")
    assert typo.returncode == EXIT_UNKNOWN, typo.stdout + typo.stderr
    assert one_line(typo.stderr) == (
        "agent status: no agent has reported a line or device named flor3 "
        "(did you mean floor3?); --force to show it anyway"
    )
    assert typo.stdout == ""
    # A line whose agents have not started yet: shown as it is, nobody active (1).
    forced = command(line, "status", "flor3", "--force", "--json")
    assert forced.returncode == 1, forced.stderr
    # A device reported is its line's.
    device = command(line, "status", "t02", "--json")
    assert '"line": "floor3"' in device.stdout, device.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["pause", "floor3\\x"],
        ["resume", "floor 3"],
        ["switchover", "floor3/"],
        ["setpoint", "set", "t01+", "21"],
        ["setpoint", "get", "#"],
        ["status", "floor 3"],
    ],
)
def test_a_name_the_agent_would_not_take_is_a_usage_error(line: LineRig, args: list[str]) -> None:
    refused = command(line, *args, "--force")
    assert refused.returncode == EXIT_USAGE
    assert "name: " in one_line(refused.stderr) and "use letters, digits" in refused.stderr
    assert line.store_value("floor3\\x\\paused") is None


def test_switchover_and_setpoint_refuse_names_nobody_reported(line: LineRig) -> None:
    report(line, LINE, "a", line.device_ids)
    moved = command(line, "switchover", "floor4")
    assert moved.returncode == EXIT_UNKNOWN
    assert "no agent has reported a line or device named floor4 (did you mean floor3?)" in (
        one_line(moved.stderr)
    )
    written = command(line, "setpoint", "set", "t1", "21")
    assert written.returncode == EXIT_UNKNOWN
    assert one_line(written.stderr) == (
        "agent setpoint: no agent has reported a device named t1 (did you mean t01?); "
        "--force to try it anyway"
    )
    assert line.store_value("t1\\setPoint") is None
    # A device is also known by the line key its agent wrote (it has no value yet: 1).
    assert command(line, "setpoint", "get", "t09").returncode == EXIT_UNKNOWN
    assert line.client.request("SET", "t09\\line", LINE).payload == b"+OK\r\n"
    assert command(line, "setpoint", "get", "t09").returncode == 1
