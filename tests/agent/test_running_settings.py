"""The settings as the running agent holds them (agent.config.running): the same answers as the
model they come from, read-only, secrets masked, carried whole across the handover; and the
agent's own process, which runs on them, never imports pydantic."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import AgentSettings, as_running
from agent.config.fingerprint import config_hash
from agent.config.running import MASK, RunningSettings, Secret
from agent.runtime import handover

ROOT = Path(__file__).resolve().parents[2]
PROFILE = {
    "protocol": "modbus",
    "points": {"setPoint": {"register": 10}, "temperature": {"register": 11, "read": 4}},
}


def line_with_everything(tmp_path: Path) -> AgentSettings:
    devices_file = tmp_path / "devices.json"
    devices_file.write_text(
        json.dumps(
            {
                "profiles": {"heat": PROFILE},
                "devices": [
                    {"id": "t01", "address": 1, "profile": "heat"},
                    {"id": "t02", "address": 2, "modbus": {"setpoint_register": 7}},
                ],
            }
        )
    )
    return AgentSettings(  # type: ignore[call-arg]
        line_id="floor3",
        instance_id="a",
        devices_file=devices_file,
        serial={"url": "/dev/ttyUSB0", "driver": "modbus"},
        mqtt={"username": "agent", "password": "hunter2", "client_id": "c-1"},
        keys={"setpoint": "{line}/{device}/sp"},
        state_dir=tmp_path,
    )


def test_running_values_answer_as_the_model_does(tmp_path: Path) -> None:
    model = line_with_everything(tmp_path)
    running = as_running(model)
    assert isinstance(running, RunningSettings)
    assert running.model_dump(mode="json") == model.model_dump(mode="json")
    assert config_hash(running) == config_hash(model)
    assert [d.id for d in running.line.devices] == ["t01", "t02"]
    assert running.line.single is model.line.single
    assert running.profile_for("t01") == model.profile_for("t01")
    assert running.profile_for(running.line.devices[1]) is None
    for name in ("client_id", "lock_key", "telemetry_line_topic"):
        assert getattr(running, name) == getattr(model, name)
    assert running.key("setpoint", "t01") == model.key("setpoint", "t01") == "floor3/t01/sp"
    assert running.point_key("mode", "t01") == model.point_key("mode", "t01")
    assert running.health.instance_topic("floor3", "a") == model.health.instance_topic(
        "floor3", "a"
    )
    assert running.line.devices[1].modbus.model_dump(exclude_none=True) == {"setpoint_register": 7}
    assert running.health.model_fields_set == model.health.model_fields_set
    assert as_running(running) is running


def test_running_values_are_read_only_and_copied_with_changes(tmp_path: Path) -> None:
    running = as_running(line_with_everything(tmp_path))
    with pytest.raises(AttributeError, match="read-only"):
        running.instance_id = "b"
    moved = running.model_copy(update={"instance_id": "b"})
    assert (moved.instance_id, running.instance_id) == ("b", "a")
    assert moved.line is running.line
    with pytest.raises(TypeError, match="no field instance"):
        running.model_copy(update={"instance": "b"})


def test_a_secret_is_masked_wherever_it_shows(tmp_path: Path) -> None:
    running = as_running(line_with_everything(tmp_path))
    password = running.mqtt.password
    assert isinstance(password, Secret)
    assert password.get_secret_value() == "hunter2"
    for shown in (repr(running), str(password), json.dumps(running.model_dump(mode="json"))):
        assert "hunter2" not in shown
    assert running.model_dump(mode="json")["mqtt"]["password"] == MASK


def test_the_handover_carries_the_settings_whole(tmp_path: Path) -> None:
    running = as_running(line_with_everything(tmp_path))
    given = handover.Handover(running, ("--log-level", "INFO"), "1.2.3")
    taken = pickle.loads(pickle.dumps(given))
    assert taken == given
    assert taken.settings.line.devices[0].resolved_profile == running.profile_for("t01")
    assert taken.settings.mqtt.password.get_secret_value() == "hunter2"


def test_the_agents_own_process_never_imports_pydantic() -> None:
    runtime = sorted(
        f"agent.runtime.{path.stem}"
        for path in (ROOT / "agent" / "runtime").glob("*.py")
        if path.stem not in {"__init__", "cli", "simulate", "simulate_view", "__main__"}
    )
    code = (
        "import importlib, sys\n"
        f"for name in {runtime!r}: importlib.import_module(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'pydantic', 'pydantic_core', 'pydantic_settings', 'dotenv', 'apscheduler'}"
        " | ({'importlib.metadata'} & set(sys.modules))))\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert shown.stdout.strip() == "[]", shown.stdout + shown.stderr


def _env(tmp_path: Path, devices: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    return env | {
        "AGENT_LINE_ID": "floor3",
        "AGENT_INSTANCE_ID": "a",
        "AGENT_DEVICES": devices,
        "AGENT_SERIAL__URL": "/dev/ttyUSB0",
        "AGENT_STATE_DIR": str(tmp_path),
    }


def test_a_reload_has_the_files_checked_again_by_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in _env(tmp_path, "t01@1,t02@2").items():
        monkeypatch.setenv(name, value)
    found = handover.check_again([])
    assert not isinstance(found, str), found
    assert isinstance(found, RunningSettings)
    assert [d.id for d in found.line.devices] == ["t01", "t02"]

    monkeypatch.setenv("AGENT_DEVICES", "t01@1,t02@1")
    refused = handover.check_again([])
    assert isinstance(refused, str)
    assert "invalid setting AGENT_DEVICES" in refused
    assert "address 1 is given to both t01 and t02" in refused


def test_every_name_the_settings_package_offers_is_there() -> None:
    import agent.config

    assert all(getattr(agent.config, name) is not None for name in agent.config.__all__)


def test_a_copy_with_a_field_changed_counts_it_as_given(tmp_path: Path) -> None:
    running = as_running(line_with_everything(tmp_path))
    assert "reconcile_interval_s" not in running.model_fields_set
    copied = running.model_copy(update={"reconcile_interval_s": 5.0})
    assert "reconcile_interval_s" in copied.model_fields_set
