"""`agent setpoint` against a real pair: a value written knowing only the device, waited
for until applied, and one the unit cannot take refused with why and an exit code of its
own, never left in the store as if it held."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ops.support import command
from tests.support.rig import DEVICE, RECORD_KEY, Rig

EXIT_REFUSED = 5


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    setup = Rig(tmp_path)
    try:
        yield setup
    finally:
        setup.close()


def test_a_value_is_written_and_waited_for(rig: Rig) -> None:
    rig.start_active("a")
    done = command(rig, "setpoint", "set", DEVICE, "22.5", "--wait", "10")
    assert done.returncode == 0, done.stderr
    rig.wait_device(lambda d: d.setpoint == 22.5)
    got = command(rig, "setpoint", "get", DEVICE)
    assert got.stdout.strip() == "22.5"


def test_a_value_off_the_units_step_says_what_the_unit_will_hold(rig: Rig) -> None:
    rig.start_active("a")
    done = command(rig, "setpoint", "set", DEVICE, "22.3", "--wait", "10")
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"agent setpoint: {DEVICE} will hold 22.5, not 22.3: the unit's setPoint goes in "
        "steps of 0.5 from 5\n"
    )
    rig.wait_device(lambda d: d.setpoint == 22.5)
    on_step = command(rig, "setpoint", "set", DEVICE, "21.5")
    assert (on_step.returncode, on_step.stderr) == (0, "")


def test_a_value_above_the_limit_is_refused_with_why(rig: Rig) -> None:
    rig.start_active("a")
    refused = command(rig, "setpoint", "set", DEVICE, "99", "--wait", "10")
    assert refused.returncode == EXIT_REFUSED, (refused.stdout, refused.stderr)
    assert "refused: 99 is above the limit 35" in refused.stderr
    assert rig.store_value() == b"20.0"  # not left in the store as if it held
    assert rig.device_writes() == []


def test_the_active_publishes_the_units_limits_in_its_record(rig: Rig) -> None:
    rig.start_active("a")
    raw = rig.store_value(RECORD_KEY)
    assert raw is not None
    assert json.loads(raw)["limits"]["setPoint"] == [5.0, 35.0, 0.5]


def test_a_refusal_of_the_unit_is_recorded_and_the_store_restored(rig: Rig) -> None:
    """A writer that does not check (any SDK): the active refuses, restores the key and
    records why, where `agent setpoint set --wait` and `agent status` read it."""
    rig.start_active("a")
    assert rig.remote_set(b"4.0") == b"+OK\r\n"
    rig.wait_store_value(b"20.0")
    raw = rig.wait_key(RECORD_KEY, lambda held: held is not None and b"refused" in held)
    assert raw is not None
    refused = json.loads(raw)["refused"]
    assert refused["point"] == "setPoint" and refused["value"] == "4.0"
    assert refused["reason"] == "4 is below the limit 5"
    assert rig.device_writes() == []
    # Once the point has synced since, the refusal is past: status no longer shows it.
    assert rig.remote_set(b"22.5") == b"+OK\r\n"
    rig.wait_device(lambda d: d.setpoint == 22.5)
    rig.wait_key(RECORD_KEY, lambda held: held is not None and b"refused" not in held)
