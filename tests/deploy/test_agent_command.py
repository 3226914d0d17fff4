"""What an operator sees of the agent on a gateway: `--print-config` says where each secret
comes from (the credential store the unit loads from included) without showing it, and the
agent logs its version when it starts."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import pytest

from agent.runtime import cli
from tests.deploy.support import ROOT
from tests.support.ports import free_port
from tests.support.processes import AgentProcess

SECRET = "s3cret-never-shown"
DEVICE = "thermostat-1"
BASE = {"AGENT_DEVICE_ID": DEVICE, "AGENT_SERIAL__URL": "socket://127.0.0.1:9"}


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """Only the given settings, credential stores under tmp_path."""
    for name in list(os.environ):
        if name.startswith("AGENT_") or name in ("CREDENTIALS_DIRECTORY", "STATE_DIRECTORY"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    stores = (tmp_path / "etc-credstore", tmp_path / "run-credstore")
    for store in stores:
        store.mkdir(mode=0o700)
    monkeypatch.setattr(cli, "CREDENTIAL_STORES", stores)
    for name, value in BASE.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def print_config(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = cli.main(["--print-config", *args])
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    return code, (json.loads(out) if code == 0 else {}), err


def test_a_password_in_the_credential_store_is_found_and_checked(
    environment: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What the issue saw: the credential exists, but --print-config run by hand said null.
    stored = tmp_path / "run-credstore" / f"agent.{DEVICE}.mqtt-password"
    stored.write_text(SECRET + "\n")
    code, _, err = print_config(capsys)
    # Checked as the service will read it: a password needs a user name.
    assert code == 78
    assert "AGENT_MQTT" in err and "password is set but username is not" in err

    environment.setenv("AGENT_MQTT__USERNAME", "gw")
    code, shown, _ = print_config(capsys)
    assert code == 0
    assert shown["mqtt"]["password"] == f"set, from credential {stored}"
    assert shown["mqtt"]["tls"]["key_password"] is None
    assert "CREDENTIALS_DIRECTORY" not in os.environ  # put back as it was


def test_a_lines_credentials_are_named_by_the_line(
    environment: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # agent@floor3 loads agent.floor3.*: --print-config looks there too.
    environment.delenv("AGENT_DEVICE_ID")
    environment.setenv("AGENT_LINE_ID", "floor3")
    environment.setenv("AGENT_DEVICES", "floor3-t01@1,floor3-t02@2")
    environment.setenv("AGENT_MQTT__USERNAME", "gw")
    stored = tmp_path / "etc-credstore" / "agent.floor3.mqtt-password"
    stored.write_text(SECRET)
    (tmp_path / "etc-credstore" / "agent.floor3-t01.mqtt-password").write_text(SECRET + "-t01")
    code, shown, _ = print_config(capsys)
    assert code == 0
    assert shown["mqtt"]["password"] == f"set, from credential {stored}"


def test_the_first_credential_store_wins_as_with_systemd(
    environment: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    environment.setenv("AGENT_MQTT__USERNAME", "gw")
    for store in ("etc-credstore", "run-credstore"):
        (tmp_path / store / f"agent.{DEVICE}.mqtt-password").write_text(SECRET)
    _, shown, _ = print_config(capsys)
    assert shown["mqtt"]["password"] == (
        f"set, from credential {tmp_path / 'etc-credstore'}/agent.{DEVICE}.mqtt-password"
    )


def test_under_systemd_the_credentials_directory_is_what_counts(
    environment: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    environment.setenv("AGENT_MQTT__USERNAME", "gw")
    (tmp_path / "etc-credstore" / f"agent.{DEVICE}.mqtt-password").write_text(SECRET)
    loaded = tmp_path / "credentials"
    loaded.mkdir()
    environment.setenv("CREDENTIALS_DIRECTORY", str(loaded))
    assert print_config(capsys)[1]["mqtt"]["password"] is None  # nothing loaded
    (loaded / "mqtt-key-password").write_text(SECRET)
    environment.setenv("AGENT_MQTT__TLS__KEY_FILE", __file__)
    environment.setenv("AGENT_MQTT__TLS__CERT_FILE", __file__)
    shown = print_config(capsys)[1]
    assert shown["mqtt"]["tls"]["key_password"] == "set, from credential"


def test_environment_and_env_file_are_named_as_sources(
    environment: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    environment.setenv("AGENT_MQTT__USERNAME", "gw")
    (tmp_path / "etc-credstore" / f"agent.{DEVICE}.mqtt-password").write_text(SECRET + "-c")
    env_file = tmp_path / f"{DEVICE}.env"
    env_file.write_text(f"AGENT_MQTT__PASSWORD='{SECRET}'\n")
    shown = print_config(capsys, "--env-file", str(env_file))[1]
    assert shown["mqtt"]["password"] == f"set, from env file {env_file}"
    environment.setenv("AGENT_MQTT__PASSWORD", SECRET)
    shown = print_config(capsys, "--env-file", str(env_file))[1]
    assert shown["mqtt"]["password"] == "set, from environment"


def test_the_agent_logs_its_version_when_it_starts(tmp_path: Path) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("AGENT_") and name not in ("NOTIFY_SOCKET", "JOURNAL_STREAM")
    }
    env.update(
        {
            **BASE,
            "AGENT_INSTANCE_ID": "gw1",
            "AGENT_MQTT__PORT": str(free_port()),  # nothing listens: it keeps trying
            "AGENT_STATE_DIR": str(tmp_path),
        }
    )
    agent = AgentProcess([], env=env, merge_stderr=True)
    try:
        match = agent.wait_for(re.compile(r"INFO \[(\S+ \S+)\] agent: agent (\S+) starting"))
    finally:
        assert agent.stop() == 0
    assert match.groups() == (f"{DEVICE} gw1", version)
