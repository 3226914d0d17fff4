"""`agent status` against a pair of agent processes serving a line of four devices."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from agent.protocol.hlc import Hlc
from tests.ops.support import Topics, command, health_topic, status, wait_in_sync, wait_pair
from tests.support.ports import free_port
from tests.support.processes import AgentProcess
from tests.support.rig import DEVICE, STANDBY, LineRig, Rig

LINE = LineRig.LINE


def start_pair(line: LineRig, topics: Topics) -> None:
    line.start_active("a")
    line.start_agent("b").wait_for_new(STANDBY)
    wait_pair(topics, LINE, "a", "b")
    wait_in_sync(topics, line.device_ids)


def test_status_shows_who_holds_the_lock_the_standby_and_every_device(
    line: LineRig, topics: Topics
) -> None:
    start_pair(line, topics)
    before = Hlc.parse(line.client.request("GET", f"{LINE}\\lock").prop("__ts") or "")
    code, document = status(line, LINE)
    after = Hlc.parse(line.client.request("GET", f"{LINE}\\lock").prop("__ts") or "")
    assert code == 0, document
    (report,) = document["lines"]
    assert report["holder"] == "a"
    assert before <= Hlc.parse(report["token"]) <= after  # the lock's version (renewed)
    assert 0 < report["lease_s"] <= line.ttl_ms / 1000
    active, standby = report["instances"]
    assert (active["instance"], active["role"], active["state"]) == ("a", "active", "running")
    assert (standby["instance"], standby["role"], standby["up"]) == ("b", "standby", True)
    assert standby["token"] is None and active["version"]
    assert [d["device"] for d in report["devices"]] == line.device_ids
    for device in report["devices"]:
        assert device["store"] == "20.0" and device["controller"] == 20.0, device
        assert device["in_sync"] and device["availability"] == "online"
        assert device["problem"] is None
    assert report["verdict"] == "ok" and document["code"] == 0

    # A device names its line; the table says the same.
    code, by_device = status(line, "t03")
    assert code == 0 and by_device["lines"][0]["line"] == LINE
    table = command(line, "status", "t03")
    assert table.returncode == 0
    assert re.search(r"\+ Line: floor3, token \d{15}:", table.stdout), table.stdout
    assert re.search(r"\| a +\| active +\| running +\| \d", table.stdout), table.stdout
    assert re.search(r"\| b +\| standby +\| running", table.stdout)
    assert re.search(r"\| t04 +\| 20\.0 +\| 20\.0 ", table.stdout)
    assert "Status: ok (exit 0)" in table.stdout

    # Without an argument: every line that has reported.
    code, every = status(line)
    assert code == 0 and [r["line"] for r in every["lines"]] == [LINE]


@pytest.mark.slow  # 11 s of faults of the pair: with the slow suite
def test_exit_codes_a_script_can_use(line: LineRig, topics: Topics) -> None:
    code, document = status(line, "nowhere", "--force")
    assert code == 1 and document["lines"][0]["verdict"] == "no agent has reported"

    active, _ = line.start_active("a", AGENT_SERIAL__PROBE_INTERVAL_S="0.5")
    topics.wait(health_topic(LINE, "a"), lambda d: d["role"] == "active")
    wait_in_sync(topics, line.device_ids)
    code, document = status(line, LINE)
    assert code == 5 and document["lines"][0]["problems"] == ["no standby"]

    standby = line.start_agent("b", AGENT_SERIAL__PROBE_INTERVAL_S="0.5")  # as configured
    standby.wait_for_new(STANDBY)
    topics.wait(health_topic(LINE, "b"), lambda d: d["role"] == "standby")
    code, document = status(line, LINE)
    assert code == 0, document["lines"][0]["problems"]

    # A unit that stops answering: degraded, named.
    mark = topics.count("devices/t02/availability")
    line.background.call(lambda: line.unit(2).fault("SILENT", 60))
    topics.wait("devices/t02/availability", lambda p: p == b"offline", after=mark, parse=False)
    code, document = status(line, LINE)
    assert code == 5 and "t02 not answering" in document["lines"][0]["problems"]
    mark = topics.count("devices/t02/availability")
    line.background.call(lambda: line.unit(2).fault("CLEAR"))
    topics.wait("devices/t02/availability", lambda p: p == b"online", after=mark, parse=False)
    topics.wait(
        "devices/t02/status", lambda d: d["in_sync"], after=topics.count("devices/t02/status") - 1
    )
    assert status(line, LINE)[0] == 0

    # Both stopped: each said it is down, nobody holds the lock.
    standby.stop()
    active.stop()
    topics.wait(health_topic(LINE, "a"), lambda d: d["status"] == "down")
    code, document = status(line, LINE)
    assert code == 1 and document["lines"][0]["verdict"] == "no active: nobody holds the lock"
    roles = {r["instance"]: (r["role"], r["state"]) for r in document["lines"][0]["instances"]}
    assert roles == {"a": ("down", "stopped"), "b": ("down", "stopped")}

    # Usage and connection failures as for agent store.
    assert command(line, "status", "--interval", "0").returncode == 2
    refused = command(line, "status", LINE, "--port", str(free_port()))
    assert refused.returncode == 4 and "cannot connect" in refused.stderr


def test_watch_redraws_on_change_until_interrupted(line: LineRig, topics: Topics) -> None:
    start_pair(line, topics)
    args = ["status", LINE, "--watch", "--interval", "5", "--port", str(line.port)]
    watch = AgentProcess([*args, "--host", "127.0.0.1"], merge_stderr=True)
    try:
        watch.wait_for_new(re.compile(r"Status: ok \(exit 0\)"))
        # A change shows without waiting for the interval: the active's health changes.
        assert command(line, "pause", LINE, "--reason", "rewiring").returncode == 0
        watch.wait_for_new(re.compile(r"Paused: rewiring"), timeout=4)
        watch.wait_for_new(re.compile(r"Status: paused: rewiring.*\(exit 6\)"), timeout=4)
        watch.signal(signal.SIGINT)
        assert watch.proc.wait(10) == 6
    finally:
        watch.stop()


def test_a_single_device_is_its_own_line(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        rig.start_active("a")
        rig.start_agent("b").wait_for_new(STANDBY)
        topics = Topics(rig.port, "agents/#", f"devices/{DEVICE}/status")
        try:
            wait_pair(topics, DEVICE, "a", "b")
            wait_in_sync(topics, [DEVICE])
        finally:
            topics.close()
        code, document = status(rig, DEVICE)
        (report,) = document["lines"]
        assert code == 0 and report["line"] == DEVICE and report["holder"] == "a"
        assert [d["device"] for d in report["devices"]] == [DEVICE]
        moved = command(rig, "switchover", DEVICE)
        assert moved.returncode == 0 and "from a to b" in moved.stdout, moved.stderr
        assert command(rig, "pause", DEVICE).returncode == 0
        assert status(rig, DEVICE)[0] == 6
        assert command(rig, "resume", DEVICE).returncode == 0
    finally:
        rig.close()


def test_simulate_shows_the_live_view() -> None:
    simulation = AgentProcess(
        ["--simulate", "--status", "--pair", "--units", "2"], {"LINES": "60", "COLUMNS": "100"}
    )
    try:
        simulation.wait_for_new(re.compile(r"\| a-standby +\| standby +\| running"), timeout=20)
        simulation.wait_for(re.compile(r"\| floor-1-t02 \| 20\.0 +\| 20\.0 "))
        simulation.wait_for(re.compile(r"Status: ok \(exit 0\)"))
        simulation.wait_for(re.compile(r"agent switchover floor-1"))  # what to try
        simulation.wait_for(re.compile(r"Latest log lines:"))
        simulation.signal(signal.SIGTERM)
        assert simulation.proc.wait(15) == 0
    finally:
        simulation.stop()


def frames(process: AgentProcess, count: int) -> list[list[str]]:
    """The next `count` whole frames the view prints (not to a terminal: one after another,
    each from its heading to the blank line before the next one)."""
    heading = re.compile(r"^agent status .* at \d{4}-\d\d-\d\d ")
    for _ in range(count + 1):
        process.wait_for_new(heading, timeout=10)
    starts = [i for i, line in enumerate(process.lines) if heading.search(line)]
    return [
        [line.rstrip("\n") for line in process.lines[start : end - 1]]
        for start, end in zip(starts[-count - 1 : -1], starts[-count:], strict=True)
    ]


@pytest.mark.parametrize("units", [pytest.param(8, marks=pytest.mark.slow), 32])
def test_simulate_fits_80x24(units: int) -> None:
    """A line of 8 is listed whole; one of 32 as the devices with a problem (none) and a
    count of the others."""
    simulation = AgentProcess(
        ["--simulate", "--status", "--pair", "--units", str(units)],
        {"LINES": "24", "COLUMNS": "80"},
    )
    try:
        simulation.wait_for_new(re.compile(r"Status: ok \(exit 0\)"), timeout=40)
        for frame in frames(simulation, 2):
            assert len(frame) <= 23 and max(map(len, frame)) <= 80, "\n".join(frame)
            listed = sum(line.startswith("| floor-1-t") for line in frame)
            if units == 8:
                assert listed == 8, frame
            else:
                assert listed == 0, frame
                assert " 32 devices: 32 in sync (--all lists every device)" in frame, frame
            assert frame[-1].strip(), frame  # no wasted row at the end
        simulation.signal(signal.SIGTERM)
        assert simulation.proc.wait(15) == 0
    finally:
        simulation.stop()
