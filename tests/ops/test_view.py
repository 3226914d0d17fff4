"""`agent status`'s view, pure: what a snapshot of a line means, its exit code, the table."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.ops import view, view_text
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
        (
            lambda s: s.health["gw2"].update(time=NOW - 17),
            view.DEGRADED,
            "gw2 is not responding (last heard 17 s ago)",
        ),
        (
            lambda s: s.health["gw2"].update(status="down", reason="stopped"),
            view.DEGRADED,
            "no standby",
        ),
        (lambda s: s.health["gw2"].update(state="failing"), view.DEGRADED, "gw2 is failing"),
        (
            lambda s: s.health["gw1"].update(time=NOW - 60),
            view.DEGRADED,
            "the active gw1 is not responding (last heard 60 s ago)",
        ),
        (
            lambda s: s.health.pop("gw1"),
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
    snapshot.health["gw1"].update(host="gw-floor3-a", started_at=NOW - 7200)
    text = view_text.render(view.assess(snapshot, NOW))
    lines = text.splitlines()
    assert lines[0].startswith("+ Line: floor3, token 001799999999000:00003:store ---")
    assert len({len(line) for line in lines[:6]}) == 1  # a box: every row as wide
    assert "| gw1      | active  | running | 2.0 s | 2 h | gw-floor3-a | 10  |" in text
    assert "| gw2      | standby | running |       |     |             | 10  |" in text
    assert "| t01    | 21.5  | 21.5 | 20.25 | yes     |" in text
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
    text = view_text.render(view.assess(snapshot, NOW))
    for device in DEVICES:
        [row] = [line for line in text.splitlines() if line.startswith(f"| {device} ")]
        store, controller = (cell.strip() for cell in row.split("|")[2:4])
        assert (store, controller) == ("20.0", "20.0"), row
    snapshot.devices["t01"] = DeviceSnapshot(b"warm", device_status("t01"))  # no number
    text = view_text.render(view.assess(snapshot, NOW))
    [row] = [line for line in text.splitlines() if line.startswith("| t01 ")]
    assert row.split("|")[2].strip() == "warm"


# --------------------------------------------------------------------------- after faults


def test_a_frozen_former_active_is_not_responding_and_the_holder_decides() -> None:
    """SIGSTOP'd, the former active's last word (active, running) stays retained while its
    lease ends and the standby takes the lock."""
    snapshot = healthy()
    snapshot.holder = b"gw2#ffff0000"
    snapshot.health["gw2"]["role"] = "active"
    snapshot.health["gw1"]["time"] = NOW - 12
    for device in snapshot.devices.values():
        device.status["instance"] = "gw2"  # type: ignore[index]
    report = view.assess(snapshot, NOW)
    assert report.holder == "gw2" and report.code == view.DEGRADED
    assert [(r.instance, r.role, r.state) for r in report.instances] == [
        ("gw2", "active", "running"),
        ("gw1", "not responding", "heard 12 s ago"),
    ]
    assert report.problems == ["gw1 is not responding (last heard 12 s ago)"]
    assert report.verdict == "degraded: gw1 is not responding (last heard 12 s ago)"
    assert "| gw1      | not responding | heard 12 s ago |" in view_text.render(report)


def test_a_holder_in_its_lock_delay_is_taking_over() -> None:
    snapshot = healthy()
    snapshot.health["gw1"].update(taking_over_s=2.0, time=NOW - 0.8, state="running")
    snapshot.devices["t01"].status = None  # nobody has driven it yet: not news
    report = view.assess(snapshot, NOW)
    assert report.instances[0].state == "taking over"
    assert report.problems == [
        "gw1 taking over: waiting for the previous lease to end (1.2 s left)"
    ]
    snapshot.health["gw1"].update(taking_over_s=0.0)  # the delay is over: nothing to say
    snapshot.devices["t01"].status = device_status("t01")
    assert view.assess(snapshot, NOW).code == view.OK


def test_devices_reconciled_after_a_takeover_are_not_out_of_sync() -> None:
    snapshot = healthy()
    snapshot.health["gw1"]["reconciling"] = 2
    for device in snapshot.devices.values():
        device.status.update(in_sync=False, reconciling=True)  # type: ignore[union-attr]
    report = view.assess(snapshot, NOW)
    assert (report.code, report.problems) == (view.OK, [])
    assert report.verdict == "ok, reconciling 2 devices after the takeover"
    assert "| t01    | 21.5  | 21.5 | 20.25 | reconciling |" in view_text.render(report)


def test_a_device_claimed_by_another_line_names_both_lines() -> None:
    snapshot = healthy()
    snapshot.health["gw1"].update(
        state="failing",
        problem="served by another line too, left alone here: t02 (line floor4)",
        conflicts=[{"device": "t02", "line": "floor4"}, {"bad": 1}, "t09"],
    )
    snapshot.devices["t02"].status.update(availability="offline", served_by="floor4")  # type: ignore[union-attr]
    report = view.assess(snapshot, NOW)
    assert report.code == view.DEGRADED
    assert report.problems == [
        "t02 is configured on lines floor3 and floor4: served by floor4 only"
    ]
    assert report.devices[1].problem == "left to line floor4"


def test_a_standby_that_cannot_take_over_is_a_problem() -> None:
    snapshot = healthy()
    snapshot.health["gw2"].update(
        state="failing",
        ready=False,
        not_ready="serial port /dev/ttyX does not exist",
        problem="cannot take over: serial port /dev/ttyX does not exist",
    )
    report = view.assess(snapshot, NOW)
    assert report.instances[1].state == "not ready"
    assert report.problems == ["gw2 cannot take over: serial port /dev/ttyX does not exist"]


def test_a_pair_that_runs_different_configurations_is_a_problem() -> None:
    snapshot = healthy()
    snapshot.health["gw1"]["config_hash"] = "3f2a91c0"
    snapshot.health["gw2"]["config_hash"] = "3f2a91c0"
    assert view.assess(snapshot, NOW).code == view.OK
    snapshot.health["gw2"]["config_hash"] = "9c1d0e22"
    report = view.assess(snapshot, NOW)
    assert report.problems == [
        "the instances run different configurations (gw1 3f2a91c0, gw2 9c1d0e22)"
    ]


def test_host_pid_and_uptime_when_the_agent_says_them() -> None:
    snapshot = healthy()
    snapshot.health["gw1"].update(host="gw-a", pid=4242, started_at=NOW - 600)
    active, standby = view.assess(snapshot, NOW).instances
    assert (active.host, active.pid, active.uptime_s) == ("gw-a", 4242, 600.0)
    assert (standby.host, standby.uptime_s) == (None, None)  # an older agent: not said


@pytest.mark.parametrize(
    "junk",
    [
        {"taking_over_s": "soon", "reconciling": "many", "conflicts": {"t01": 1}},
        {"started_at": [], "host": 7, "pid": True, "ready": "no", "config_hash": 3},
    ],
)
def test_what_makes_no_sense_is_ignored(junk: dict[str, Any]) -> None:
    snapshot = healthy()
    snapshot.health["gw1"].update(junk)
    report = view.assess(snapshot, NOW)
    assert report.code == view.OK, report.problems
    assert view_text.render(report)


# --------------------------------------------------------------------------- fitting


def line_of(count: int) -> LineSnapshot:
    snapshot = healthy()
    ids = [f"floor3-t{n:02d}" for n in range(1, count + 1)]
    for name in ("gw1", "gw2"):
        snapshot.health[name].update(devices=ids, host=f"gw-floor3-{name}", started_at=NOW)
    snapshot.devices = {d: DeviceSnapshot(b"21.5", device_status(d)) for d in ids}
    return snapshot


def fits(text: str, rows: int, width: int = 80) -> list[str]:
    lines = text.splitlines()
    assert len(lines) <= rows and max(map(len, lines)) <= width, "\n" + text
    return lines


def test_a_line_of_32_fits_80x24_with_the_devices_that_have_a_problem() -> None:
    snapshot = line_of(32)
    for name in ("floor3-t07", "floor3-t19"):
        snapshot.devices[name].status.update(availability="offline")  # type: ignore[union-attr]
    report = view.assess(snapshot, NOW)
    lines = fits(view_text.render(report, rows=22, width=80), 22)
    shown = [line.split()[1] for line in lines if line.startswith("| floor3-t")]
    assert shown == ["floor3-t07", "floor3-t19"]
    assert " 30 more devices: 30 in sync (--all lists every device)" in lines
    assert lines[-1].endswith("(exit 5)")
    every = view_text.render(report, rows=22, width=80, every=True).splitlines()
    assert len([line for line in every if line.startswith("| floor3-t")]) == 32
    # Healthy, and room enough: every device.
    assert "| floor3-t04 |" in view_text.render(view.assess(line_of(4), NOW), rows=22, width=80)


def test_a_line_of_32_all_failing_still_fits_and_says_it_in_one_verdict() -> None:
    snapshot = line_of(32)
    for device in snapshot.devices.values():
        device.status.update(availability="offline")  # type: ignore[union-attr]
    report = view.assess(snapshot, NOW)
    lines = fits(view_text.render(report, rows=22, width=80), 22)
    assert (
        " Status: degraded: 32 devices not answering (floor3-t01, floor3-t02, floor3-t03,"
        in (lines[-2])
    )
    assert len(report.problems) == 32  # every one in the JSON
    shown = fits(view_text.render(report, rows=9, width=80), 9)
    assert shown[-3].startswith(" 32 devices: 32 with")


def test_a_long_host_name_is_cut_to_the_width() -> None:
    snapshot = line_of(2)
    snapshot.health["gw1"]["host"] = "gw-" + "x" * 120
    lines = fits(view_text.render(view.assess(snapshot, NOW), rows=22, width=80), 22)
    assert any("…" in line for line in lines)


def test_a_refused_reload_is_a_problem_until_one_loads() -> None:
    snapshot = healthy()
    snapshot.health["gw2"]["reload_refused"] = "invalid setting AGENT_DEVICES_FILE (x): bad"
    report = view.assess(snapshot, NOW)
    assert report.code == 5
    assert report.problems == [
        "gw2 refused a reload (a restart would fail the same way): invalid setting "
        "AGENT_DEVICES_FILE (x): bad"
    ]
    snapshot.health["gw2"]["reload_refused"] = None
    assert view.assess(snapshot, NOW).code == 0


def test_a_refusal_shows_its_age_and_counters_that_do_not_fit_get_a_line_of_their_own() -> None:
    snapshot = healthy()
    written = Hlc(int((NOW - 180) * 1000), 0, "store")
    refused = {"point": "setPoint", "value": "99", "reason": "99 is above the limit 35"}
    errors = {
        "controller_errors": 1234,
        "store_errors": 56,
        "invalid_remote_values": 7,
        "fenced_writes_rejected": 3,
        "lock_losses": 2,
    }
    snapshot.devices["t01"].status = device_status(
        "t01", errors=errors, refused={**refused, "version": str(written)}
    )
    shown = view_text.render(view.assess(snapshot, NOW), rows=22, width=80).splitlines()
    assert max(len(line) for line in shown) <= 80
    assert " t01: setPoint 99 refused 3 min ago: 99 is above the limit 35" in shown
    assert " t01 errors: controller 1234, store 56, invalid 7, fenced 3, lock losses 2" in shown
    # Counters that fit their cell are not said twice.
    assert not [line for line in shown if line.startswith(" t02 errors")]


def test_humidity_is_shown_beside_the_temperature_where_a_unit_reads_it() -> None:
    snapshot = healthy()
    assert "RH %" not in view_text.render(view.assess(snapshot, NOW))  # no unit reads it
    snapshot.devices["t01"].status["points"] = {"humidity": 45.5, "mode": "heat"}
    text = view_text.render(view.assess(snapshot, NOW))
    assert "| Device | Store | Unit | Temp  | RH % | In sync |" in text
    assert "| t01    | 21.5  | 21.5 | 20.25 | 45.5 | yes     |" in text
    assert view.assess(snapshot, NOW).devices[0].humidity == 45.5
    # Where the column would not fit the terminal, the table goes without it.
    many = line_of(32)
    for device in many.devices.values():
        device.status["points"] = {"humidity": 61.0}
    fitted = fits(view_text.render(view.assess(many, NOW), rows=24, width=80), 24)
    assert "RH %" not in "\n".join(fitted)
    assert "RH %" in view_text.render(view.assess(many, NOW), width=100, every=True)
