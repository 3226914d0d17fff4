"""`agent status`'s view, pure: what a snapshot of a line means, its exit code, the table."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.ops import view
from agent.ops.control import PauseNote, SwitchoverRequest
from agent.ops.view import DeviceSnapshot, LineSnapshot
from agent.protocol.hlc import Hlc

NOW = 1_800_000_000.0
DEVICES = ["t01", "t02"]


def health(instance: str, role: str, **changes: Any) -> dict[str, Any]:
    document = {
        "status": "up",
        "pid": 10,
        "time": NOW - 1,
        "line": "floor3",
        "instance": instance,
        "role": role,
        "state": "running",
        "paused": False,
        "version": "0.1.0",
        "ttl_ms": 3000,
        "heartbeat_s": 5.0,
        "devices": DEVICES,
    }
    document.update(changes)
    return document


def device_status(device: str, **changes: Any) -> dict[str, Any]:
    document = {
        "device": device,
        "instance": "gw1",
        "availability": "online",
        "controller": "ok",
        "setpoint": 21.5,
        "temperature": 20.25,
        "in_sync": True,
        "last_sync": "2027-01-15T08:00:00.000Z",
        "errors": {"controller_errors": 0, "store_errors": 2},
    }
    document.update(changes)
    return document


def healthy() -> LineSnapshot:
    return LineSnapshot(
        "floor3",
        holder=b"gw1#0a1b2c3d",
        lock_version=Hlc(int((NOW - 1) * 1000), 3, "store"),
        health={"gw1": health("gw1", "active"), "gw2": health("gw2", "standby")},
        devices={d: DeviceSnapshot(b"21.5", device_status(d)) for d in DEVICES},
    )


def test_a_healthy_pair_is_ok_with_the_lease_from_the_lock_version() -> None:
    report = view.assess(healthy(), NOW)
    assert (report.code, report.verdict, report.problems) == (0, "ok", [])
    assert report.holder == "gw1" and report.lease_s == pytest.approx(2.0)
    active, standby = report.instances
    assert (active.role, active.token, active.lease_s) == ("active", report.token, 2.0)
    assert (standby.role, standby.up, standby.token) == ("standby", True, None)
    assert [d.device for d in report.devices] == DEVICES
    assert report.devices[0].errors == {"store_errors": 2}


def test_the_lock_decides_who_is_active_whatever_an_instance_says() -> None:
    snapshot = healthy()
    snapshot.holder = b"gw2#ffff0000"
    snapshot.health["gw2"]["role"] = "starting"
    report = view.assess(snapshot, NOW)
    assert [(r.instance, r.role) for r in report.instances] == [
        ("gw2", "active"),
        ("gw1", "active, no lock"),
    ]
    # gw1 says it is active but holds nothing: no standby; the statuses are gw1's.
    assert report.code == view.DEGRADED
    assert "no standby" in report.problems
    assert "t01 status from gw1, not the active" in report.problems


@pytest.mark.parametrize(
    ("change", "code", "problem"),
    [
        (lambda s: setattr(s, "holder", None), view.NO_ACTIVE, "no active: nobody holds the lock"),
        (lambda s: s.health.pop("gw2"), view.DEGRADED, "no standby"),
        (lambda s: s.health["gw2"].update(time=NOW - 17), view.DEGRADED, "no standby"),
        (
            lambda s: s.health["gw2"].update(status="down", reason="stopped"),
            view.DEGRADED,
            "no standby",
        ),
        (lambda s: s.health["gw2"].update(state="failing"), view.DEGRADED, "gw2 is failing"),
        (
            lambda s: s.health["gw1"].update(time=NOW - 60),
            view.DEGRADED,
            "the active gw1 does not report (no health heartbeat)",
        ),
        (
            lambda s: s.devices["t02"].status.update(availability="offline"),  # type: ignore[union-attr]
            view.DEGRADED,
            "t02 not answering",
        ),
        (
            lambda s: s.devices["t01"].status.update(in_sync=False),  # type: ignore[union-attr]
            view.DEGRADED,
            "t01 not in sync",
        ),
        (
            lambda s: setattr(s.devices["t01"], "status", None),
            view.DEGRADED,
            "t01 no status reported",
        ),
        (
            lambda s: setattr(s, "paused", PauseNote("ops@x", "", "rewiring")),
            view.PAUSED,
            None,
        ),
    ],
)
def test_what_is_wrong_gives_the_exit_code(change: Any, code: int, problem: str | None) -> None:
    snapshot = healthy()
    change(snapshot)
    report = view.assess(snapshot, NOW)
    assert report.code == code, report.problems
    if problem is not None:
        assert problem in report.problems


def test_paused_counts_before_degraded_and_no_active_before_both() -> None:
    snapshot = healthy()
    snapshot.paused = PauseNote("ops@x", "2027-01-15T08:00:00Z", "rewiring")
    snapshot.devices["t01"].status = device_status("t01", availability="offline")
    report = view.assess(snapshot, NOW)
    assert report.code == view.PAUSED
    assert report.verdict == "paused: rewiring, by ops@x, at 2027-01-15T08:00:00Z"
    snapshot.holder = None
    assert view.assess(snapshot, NOW).code == view.NO_ACTIVE
    assert view.worst([0, 5, 6]) == 6 and view.worst([6, 1, 0]) == 1 and view.worst([]) == 1


def test_nothing_reported_at_all() -> None:
    report = view.assess(LineSnapshot("nowhere"), NOW)
    assert (report.code, report.verdict) == (1, "no agent has reported")
    assert report.instances == [] and report.devices == []


def test_the_devices_are_the_actives_then_the_others_and_the_named_one() -> None:
    snapshot = healthy()
    snapshot.health["gw2"]["devices"] = ["t02", "t09"]
    snapshot.named_device = "t42"
    assert snapshot.device_ids() == ["t01", "t02", "t09", "t42"]


def test_the_table_like_patronictl_list() -> None:
    snapshot = healthy()
    snapshot.switchover = SwitchoverRequest("gw1#0a1b2c3d", "gw2", "ops@x", "")
    text = view.render(view.assess(snapshot, NOW))
    lines = text.splitlines()
    assert lines[0].startswith("+ Line: floor3 ---")
    assert len({len(line) for line in lines[:6]}) == 1  # a box: every row as wide
    assert (
        "| gw1      | active  | running | 001799999999000:00003:store | 2.0 s | 1.0 s ago" in text
    )
    assert "| t01    | 21.5  | 21.5       | 20.25 | yes     |" in text
    assert "store 2" in text
    assert " Switchover requested: gw1 -> gw2" in text
    assert lines[-1] == " Status: ok (exit 0)"


def test_json_holds_everything_the_table_shows() -> None:
    snapshot = healthy()
    snapshot.paused = PauseNote("ops@x", "", "rewiring")
    document = json.loads(view.as_json([view.assess(snapshot, NOW)]))
    assert document["code"] == 6
    (line,) = document["lines"]
    assert line["paused"] == {"by": "ops@x", "at": "", "reason": "rewiring"}
    assert line["instances"][0]["instance"] == "gw1"
    assert line["devices"][1]["device"] == "t02"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, ""), (0.25, "0.2 s"), (12.4, "12 s"), (600, "10 min"), (86400, "24 h")],
)
def test_ages(seconds: float | None, shown: str) -> None:
    assert view.age(seconds) == shown


def test_a_set_point_reads_the_same_in_the_store_and_the_controller_columns() -> None:
    """Was: the store's 20.0 beside the controller's 20, the same value."""
    snapshot = healthy()
    snapshot.devices["t01"] = DeviceSnapshot(b"20.0", device_status("t01", setpoint=20.0))
    snapshot.devices["t02"] = DeviceSnapshot(b"20.00", device_status("t02", setpoint=20))
    text = view.render(view.assess(snapshot, NOW))
    for device in DEVICES:
        [row] = [line for line in text.splitlines() if line.startswith(f"| {device} ")]
        store, controller = (cell.strip() for cell in row.split("|")[2:4])
        assert (store, controller) == ("20.0", "20.0"), row
    snapshot.devices["t01"] = DeviceSnapshot(b"warm", device_status("t01"))  # no number
    text = view.render(view.assess(snapshot, NOW))
    [row] = [line for line in text.splitlines() if line.startswith("| t01 ")]
    assert row.split("|")[2].strip() == "warm"
