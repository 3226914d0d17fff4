"""A reload (SIGHUP, as `systemctl reload` sends it) reads the devices again and applies a
valid change at once, without losing the lease or touching the devices that did not
change; an invalid change is refused whole and the running configuration stays."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.agent.test_liveness import log_time
from tests.ops.support import Topics, health_topic, status
from tests.support.rig import STANDBY, STEPPED_DOWN, LineRig

RELOADED = re.compile(r"reloaded: (.*) \(configuration (\w+), was (\w+)\)")
REFUSED = re.compile(r"reload refused: (.*); running configuration (\w+)")


class FileRig(LineRig):
    """The line's devices in a devices file (AGENT_DEVICES_FILE), as a reload reads them."""

    def __init__(self, tmp_path: Path, units: int, **options: Any) -> None:
        self.devices_file = tmp_path / "devices.json"
        super().__init__(tmp_path, units, **options)
        self.write_devices([1, 2])

    def write_devices(self, addresses: list[int]) -> None:
        entries = [{"id": self.device_id(n), "address": n} for n in addresses]
        self.devices_file.write_text(json.dumps(entries))

    def env(self, instance: str, **extra: str) -> dict[str, str]:
        env = super().env(instance, **extra)
        del env["AGENT_DEVICES"]
        env["AGENT_DEVICES_FILE"] = str(self.devices_file)
        return env


def test_a_device_added_and_one_removed_apply_at_once_without_losing_the_lease(
    tmp_path: Path,
) -> None:
    # A lease a loaded machine does not lose by itself: a step-down here is the reload's.
    rig = FileRig(tmp_path, 3, ttl_ms=3000)
    health = Topics(rig.port, health_topic(rig.LINE, "a"), health_topic(rig.LINE, "b"))
    try:
        active, _ = rig.start_active("a", AGENT_HEALTH__INTERVAL_S="1")
        standby = rig.start_agent("b", AGENT_HEALTH__INTERVAL_S="1")
        standby.wait_for_new(STANDBY)
        before = health.wait(health_topic(rig.LINE, "a"), lambda d: d.get("role") == "active")
        rig.write_devices([1, 3])  # t02 leaves the line, t03 joins it
        seen = len(rig.store_events)
        sent = time.time()
        for process in (active, standby):
            process.signal(signal.SIGHUP)
        done = active.wait_for_new(RELOADED, timeout=10)
        assert done.group(1) == "added t03; removed t02"
        assert done.group(3) == before["config_hash"] != done.group(2)
        assert standby.wait_for_new(RELOADED, timeout=10).group(2) == done.group(2)
        took = log_time(done.string) - sent
        # t03 is served both ways, right away.
        assert rig.remote_set_device(3, b"24.5") == b"+OK\r\n"
        rig.wait_line(lambda line: line.unit(3).setpoint == 24.5)
        rig.background.call(lambda: rig.unit(3).panel_setpoint(26.0))
        rig.wait_store({3: b"26.0"})
        # t01 was not taken over again: nothing of it written since the reload.
        t01 = [e for e in rig.store_events[seen:] if e.key.startswith(b"t01\\")]
        assert t01 == [], t01
        assert rig.remote_set_device(1, b"22.5") == b"+OK\r\n"
        rig.wait_line(lambda line: line.unit(1).setpoint == 22.5)
        # Both instances say so in their health; neither lost its role.
        for instance in ("a", "b"):
            health.wait(
                health_topic(rig.LINE, instance),
                lambda d: d.get("config_hash") == done.group(2) and "t02" not in d["devices"],
            )
        for process in (active, standby):
            process.drain()
            assert not any(STEPPED_DOWN.search(t) for t in process.lines), process.lines
        holder = rig.store_value(rig.lock_key)
        assert holder is not None and holder.startswith(b"a#")
        assert took < 2.5, took  # within a lease: nothing waited out
    finally:
        health.close()
        rig.close()


def test_an_invalid_change_is_refused_whole_and_the_line_runs_on(tmp_path: Path) -> None:
    rig = FileRig(tmp_path, 3, ttl_ms=1500)
    try:
        active, _ = rig.start_active("a")
        # t03 joins at t01's address: the whole change is refused, t03 not added either.
        rig.devices_file.write_text(
            json.dumps(
                [
                    {"id": "t01", "address": 1},
                    {"id": "t02", "address": 2},
                    {"id": "t03", "address": 1},
                ]
            )
        )
        active.signal(signal.SIGHUP)
        refused = active.wait_for_new(REFUSED, timeout=10)
        assert "AGENT_DEVICES_FILE" in refused.group(1) and "address 1" in refused.group(1)
        rig.devices_file.write_text("[{")
        active.signal(signal.SIGHUP)
        assert "AGENT_DEVICES_FILE" in active.wait_for_new(REFUSED, timeout=10).group(1)
        assert rig.remote_set_device(2, b"23.5") == b"+OK\r\n"
        rig.wait_line(lambda line: line.unit(2).setpoint == 23.5)
        assert active.proc.poll() is None
    finally:
        rig.close()


def test_a_reload_to_no_devices_is_refused_as_at_start(tmp_path: Path) -> None:
    """An empty devices list would not start (exit 78): applied on reload, the active would
    keep the lease of a line it serves nothing of, and its standby never take over."""
    rig = FileRig(tmp_path, 2, ttl_ms=1500)
    try:
        active, _ = rig.start_active("a")
        rig.devices_file.write_text("[]")
        active.signal(signal.SIGHUP)
        refused = active.wait_for_new(REFUSED, timeout=10)
        assert f"no device of line {rig.LINE} can be served" in refused.group(1)
        assert rig.remote_set_device(1, b"23.5") == b"+OK\r\n"
        rig.wait_line(lambda line: line.unit(1).setpoint == 23.5)
        active.drain()
        assert not any(RELOADED.search(t) for t in active.lines), active.lines
        assert active.proc.poll() is None
    finally:
        rig.close()


@pytest.mark.slow  # a real agent through a refused reload and a good one: a few seconds
def test_a_refused_reload_fails_the_reload_command_and_shows_in_status(tmp_path: Path) -> None:
    rig = FileRig(tmp_path, 3, ttl_ms=1500)
    runtime = tmp_path / "run"
    runtime.mkdir()
    health = Topics(rig.port, health_topic(rig.LINE, "a"))
    try:
        active, _ = rig.start_active("a", RUNTIME_DIRECTORY=str(runtime))

        def reload_command() -> subprocess.CompletedProcess[str]:
            where = ["--pid", str(active.proc.pid), "--runtime-dir", str(runtime)]
            return subprocess.run(
                [sys.executable, "-m", "agent", "reload", *where],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip

        rig.devices_file.write_text("[{")
        refused = reload_command()
        assert refused.returncode == 1, refused
        assert refused.stderr.startswith(
            "agent reload: refused: invalid setting AGENT_DEVICES_FILE"
        )
        health.wait(health_topic(rig.LINE, "a"), lambda d: d.get("reload_refused") is not None)
        code, document = status(rig, rig.LINE)
        assert code == 5
        (said,) = [p for p in document["lines"][0]["problems"] if "reload" in p]
        assert said.startswith("a refused a reload (a restart would fail the same way): invalid")

        rig.write_devices([1, 2, 3])
        loaded = reload_command()
        assert (loaded.returncode, loaded.stdout) == (0, ""), loaded
        health.wait(health_topic(rig.LINE, "a"), lambda d: d.get("reload_refused") is None)
        _, document = status(rig, rig.LINE)
        assert not [p for p in document["lines"][0]["problems"] if "reload" in p]
    finally:
        health.close()
        rig.close()
