"""The `agent` command's configuration, as a real process: environment, env file,
credential files and flags; exit 78 (EX_CONFIG) on invalid settings; secrets never shown."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EXIT_CONFIG = 78
SECRET = "hunter2-not-for-print"
# Enough for a valid configuration that --print-config can show.
BASE = {"AGENT_DEVICE_ID": "thermostat-1", "AGENT_SERIAL__URL": "socket://127.0.0.1:9"}


def run_agent(
    *args: str, env: dict[str, str] | None = None, timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    """`python -m agent ARGS` with only the given settings in its environment."""
    clean = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("AGENT_")
        and name not in ("CREDENTIALS_DIRECTORY", "STATE_DIRECTORY", "NOTIFY_SOCKET")
    }
    return subprocess.run(
        [sys.executable, "-m", "agent", *args],
        env={**clean, "COLUMNS": "100", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def printed_config(*args: str, env: dict[str, str]) -> dict[str, Any]:
    result = run_agent("--print-config", *args, env=env)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = json.loads(result.stdout)
    return config


@pytest.mark.parametrize(
    ("env", "named"),
    [
        pytest.param({**BASE, "AGENT_LOCK__TTL_MS": "10"}, "AGENT_LOCK__TTL_MS", id="ttl"),
        pytest.param({**BASE, "AGENT_MQTT__PORT": "0"}, "AGENT_MQTT__PORT", id="port"),
        pytest.param({**BASE, "AGENT_MQTT__PORT": "x"}, "AGENT_MQTT__PORT", id="port-text"),
        pytest.param({"AGENT_SERIAL__URL": "socket://h:1"}, "AGENT_DEVICE_ID", id="no-device"),
        pytest.param({"AGENT_DEVICE_ID": "thermostat-1"}, "AGENT_SERIAL__URL", id="no-serial"),
        pytest.param({**BASE, "AGENT_DEVICE_ID": "plant/1"}, "AGENT_DEVICE_ID", id="slash"),
        pytest.param({**BASE, "AGENT_DEVICE_ID": "t 1"}, "AGENT_DEVICE_ID", id="space"),
        pytest.param({**BASE, "AGENT_DEVICE_ID": "t#"}, "AGENT_DEVICE_ID", id="wildcard"),
        pytest.param({**BASE, "AGENT_SERIAL__PARITY": "X"}, "AGENT_SERIAL__PARITY", id="parity"),
    ],
)
def test_invalid_setting_exits_78_naming_its_variable(env: dict[str, str], named: str) -> None:
    result = run_agent(env=env)
    assert result.returncode == EXIT_CONFIG, result.stdout + result.stderr
    assert named in result.stderr
    assert "invalid setting" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_invalid_flag_value_is_named_as_its_variable_too() -> None:
    result = run_agent("--lock-ttl-ms", "10", env=BASE)
    assert result.returncode == EXIT_CONFIG
    assert "AGENT_LOCK__TTL_MS" in result.stderr


def test_missing_env_file_exits_78(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "agent.env"
    result = run_agent("--env-file", str(missing), env=BASE)
    assert result.returncode == EXIT_CONFIG
    assert "--env-file" in result.stderr and str(missing) in result.stderr


def test_the_null_device_is_an_empty_env_file() -> None:
    """Was: "--env-file /dev/null: no such file" (exit 78)."""
    config = printed_config("--env-file", os.devnull, env=BASE)
    assert config["derived"]["line_id"] == BASE["AGENT_DEVICE_ID"]


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(lambda path: path.mkdir(), "not a regular file", id="directory"),
        pytest.param(
            lambda path: path.write_bytes(b"AGENT_INSTANCE_ID=a\n\xff\n"), "not UTF-8", id="binary"
        ),
    ],
)
def test_an_env_file_that_cannot_be_read_names_the_flag_and_the_file(
    tmp_path: Path, make: Any, reason: str
) -> None:
    """Was: a non-UTF-8 file ended in a UnicodeDecodeError traceback."""
    env_file = tmp_path / "agent.env"
    make(env_file)
    result = run_agent("--env-file", str(env_file), env=BASE)
    assert result.returncode == EXIT_CONFIG, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"agent: --env-file {env_file}: {reason}"), line


@pytest.mark.parametrize("units", ["0", "-1", "248"])
def test_a_simulated_line_of_no_thermostat_is_refused_in_one_line(units: str) -> None:
    """Was: --simulate --units 0 ran a single thermostat."""
    result = run_agent("--simulate", "--units", units)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"agent: --units {units}: a line has 1 to 247 thermostats (leave --units out for one)"
    ]


def test_a_simulation_flag_without_simulate_is_said_in_one_line() -> None:
    result = run_agent("--units", "3", "--status", env=BASE)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "agent: --units and --status: only with --simulate (add --simulate)"
    ]


def test_a_health_port_in_use_exits_78_at_start_naming_its_variable(tmp_path: Path) -> None:
    """Was: logged once the agent had a role, and the agent ran on without its endpoint.
    Now said before any broker is reached (none listens on this one)."""
    with socket.socket() as taken, socket.socket() as no_broker:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        no_broker.bind(("127.0.0.1", 0))  # bound, never listening: refuses connections
        env = {
            **BASE,
            "AGENT_STATE_DIR": str(tmp_path),
            "AGENT_MQTT__HOST": "127.0.0.1",
            "AGENT_MQTT__PORT": str(no_broker.getsockname()[1]),
            "AGENT_HEALTH__PORT": str(taken.getsockname()[1]),
        }
        result = run_agent(env=env)
    assert result.returncode == EXIT_CONFIG, result.stderr
    assert "invalid setting AGENT_HEALTH__PORT (health.port)" in result.stderr
    assert f"cannot listen on 127.0.0.1:{env['AGENT_HEALTH__PORT']}" in result.stderr
    assert "Traceback" not in result.stderr


def test_invalid_secret_setting_does_not_echo_the_secret() -> None:
    # A password without a user name is refused; the message must not quote it.
    result = run_agent(env={**BASE, "AGENT_MQTT__PASSWORD": SECRET})
    assert result.returncode == EXIT_CONFIG
    assert "AGENT_MQTT" in result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_flags_win_over_the_environment_which_wins_over_the_env_file(tmp_path: Path) -> None:
    env_file = tmp_path / "agent.env"
    env_file.write_text(
        "AGENT_LOCK__TTL_MS=4000\n"
        "AGENT_TELEMETRY__INTERVAL_S=7\n"
        "AGENT_MQTT__HOST=file-host\n"
        "AGENT_INSTANCE_ID=from-file\n"
    )
    env = {**BASE, "AGENT_LOCK__TTL_MS": "5000", "AGENT_MQTT__HOST": "env-host"}
    config = printed_config("--env-file", str(env_file), "--mqtt-host", "flag-host", env=env)
    assert config["mqtt"]["host"] == "flag-host"  # flag over environment and file
    assert config["lock"]["ttl_ms"] == 5000  # environment over file
    assert config["telemetry"]["interval_s"] == 7.0  # the file, where nothing else says
    assert config["instance_id"] == "from-file"
    assert config["derived"]["client_id"] == "agent-thermostat-1-from-file"


def test_env_file_alone_is_a_complete_configuration(tmp_path: Path) -> None:
    env_file = tmp_path / "agent.env"
    env_file.write_text(
        "# as in /etc/agent/agent.env\n"
        "AGENT_DEVICE_ID=boiler-7\n"
        "AGENT_INSTANCE_ID=b\n"
        "AGENT_SERIAL__URL=socket://10.0.0.5:4001\n"
        "AGENT_SERIAL__BAUDRATE=19200\n"
    )
    config = printed_config("--env-file", str(env_file), env={})
    assert config["device_id"] == "boiler-7"
    assert config["serial"]["baudrate"] == 19200
    # A single device is a line of its own: its keys and lock are what they always were.
    assert config["derived"] == {
        "line_id": "boiler-7",
        "client_id": "agent-boiler-7-b",
        "lock_key": "boiler-7\\lock",
        "line_telemetry_topic": "lines/boiler-7/telemetry",
        "config_hash": config["derived"]["config_hash"],
        "devices": {
            "boiler-7": {
                "address": None,
                "setpoint_key": "boiler-7\\setPoint",
                "synced_key": "boiler-7\\synced",
                "line_key": "boiler-7\\line",
                "telemetry_topic": "devices/boiler-7/telemetry",
            }
        },
    }


def test_print_config_masks_the_password_and_shows_derived_keys() -> None:
    env = {
        **BASE,
        "AGENT_INSTANCE_ID": "a",
        "AGENT_MQTT__USERNAME": "u",
        "AGENT_MQTT__PASSWORD": SECRET,
    }
    result = run_agent("--print-config", env=env)
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout + result.stderr
    config = json.loads(result.stdout)
    assert config["mqtt"]["username"] == "u"
    assert config["mqtt"]["password"] == "set, from environment"
    assert config["mqtt"]["tls"]["key_password"] is None
    assert config["derived"]["client_id"] == "agent-thermostat-1-a"
    assert config["derived"]["lock_key"] == "thermostat-1\\lock"
    device = config["derived"]["devices"]["thermostat-1"]
    assert device["setpoint_key"] == "thermostat-1\\setPoint"
    assert device["telemetry_topic"] == "devices/thermostat-1/telemetry"


def test_print_config_shows_the_configuration_hash_the_running_agent_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hash of what the files say, as the instance's health and `agent status` show it
    once the agent runs them: the playbook compares the two after a reload."""
    from agent.config import AgentSettings
    from agent.config.fingerprint import config_hash

    devices = tmp_path / "devices.json"
    devices.write_text('[{"id": "t1", "address": 1}, {"id": "t2", "address": 2}]')
    env = {
        "AGENT_LINE_ID": "floor3",
        "AGENT_DEVICES_FILE": str(devices),
        "AGENT_SERIAL__URL": "socket://127.0.0.1:9",
    }
    shown = printed_config(env={**env, "AGENT_INSTANCE_ID": "a"})["derived"]["config_hash"]
    for name in [n for n in os.environ if n.startswith("AGENT_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert shown == config_hash(AgentSettings(instance_id="b"))
    devices.write_text('[{"id": "t1", "address": 1}, {"id": "t2", "address": 3}]')
    assert printed_config(env=env)["derived"]["config_hash"] != shown


def test_password_from_the_credentials_directory_is_used_and_never_printed(
    tmp_path: Path,
) -> None:
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    env = {**BASE, "AGENT_MQTT__USERNAME": "u", "CREDENTIALS_DIRECTORY": str(credentials)}
    assert printed_config(env=env)["mqtt"]["password"] is None  # no file: no password

    (credentials / "mqtt-password").write_text(SECRET + "\n")
    result = run_agent("--print-config", env=env)
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert json.loads(result.stdout)["mqtt"]["password"] == "set, from credential"

    # Without a user name the file's password is refused, without quoting it.
    refused = run_agent(env={k: v for k, v in env.items() if k != "AGENT_MQTT__USERNAME"})
    assert refused.returncode == EXIT_CONFIG
    assert "password is set but username is not" in refused.stderr
    assert SECRET not in refused.stdout + refused.stderr


def test_help_lists_flags_with_defaults_and_variables_and_no_secret(tmp_path: Path) -> None:
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "mqtt-password").write_text(SECRET + "-file\n")
    env = {
        **BASE,
        "AGENT_MQTT__USERNAME": "u",
        "AGENT_MQTT__PASSWORD": SECRET,
        "AGENT_MQTT__TLS__KEY_PASSWORD": SECRET + "-key",
        "CREDENTIALS_DIRECTORY": str(credentials),
    }
    result = run_agent("--help", env=env)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps at spaces
    for flag, variable, default in (
        ("--device-id", "AGENT_DEVICE_ID", "none"),
        ("--line-id", "AGENT_LINE_ID", "none"),
        ("--devices", "AGENT_DEVICES", "none"),
        ("--mqtt-host", "AGENT_MQTT__HOST", "localhost"),
        ("--mqtt-port", "AGENT_MQTT__PORT", "1883"),
        ("--lock-ttl-ms", "AGENT_LOCK__TTL_MS", "3000"),
        ("--serial-baudrate", "AGENT_SERIAL__BAUDRATE", "9600"),
        ("--telemetry-interval-s", "AGENT_TELEMETRY__INTERVAL_S", "10.0"),
        ("--mqtt-tls-ca-file", "AGENT_MQTT__TLS__CA_FILE", "none"),
    ):
        assert f"{flag} VALUE" in text
        assert f"[{variable}; default: {default}]" in text
    assert "--print-config" in text and "--env-file" in text
    # Secrets have no flags (they would show in `ps`), and no value of one is shown.
    assert "--mqtt-password" not in text and "--mqtt-tls-key-password" not in text
    assert "AGENT_MQTT__PASSWORD" in text  # named as coming from the environment only
    assert SECRET not in result.stdout + result.stderr


def test_a_tls_file_that_cannot_be_used_is_a_setting_error(tmp_path: Path) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("this is not a certificate\n")
    result = run_agent(
        env={
            **BASE,
            "AGENT_MQTT__TLS__CA_FILE": str(not_pem),
            "AGENT_STATE_DIR": str(tmp_path / "state"),
            "AGENT_SERIAL__LOCK_DIR": "",
        }
    )
    assert result.returncode == 78, result.stderr
    assert "AGENT_MQTT__TLS" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_profile_that_makes_no_sense_exits_78_naming_it_and_its_point(tmp_path: Path) -> None:
    points = {
        "setPoint": {"register": 0},
        "temperature": {"register": 1},
        "mode": {"register": 2, "values": {"off": 0, "heat": 0}},
    }
    devices = tmp_path / "devices.json"
    devices.write_text(
        json.dumps(
            {
                "profiles": {"kc": {"protocol": "modbus", "points": points}},
                "devices": [{"id": "t01", "address": 1, "profile": "kc"}],
            }
        )
    )
    env = {
        "AGENT_LINE_ID": "floor3",
        "AGENT_SERIAL__URL": "socket://127.0.0.1:9",
        "AGENT_SERIAL__DRIVER": "modbus",
        "AGENT_DEVICES_FILE": str(devices),
    }
    result = run_agent(env=env)
    assert result.returncode == EXIT_CONFIG, result.stdout + result.stderr
    assert "AGENT_DEVICES_FILE" in result.stderr
    assert "profile kc, point mode: off and heat both have the register value 0" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("driver", ["line", "modbus"])
def test_the_sim_profile_is_built_in_for_either_driver(driver: str) -> None:
    env = {
        "AGENT_LINE_ID": "floor3",
        "AGENT_SERIAL__URL": "socket://127.0.0.1:9",
        "AGENT_SERIAL__DRIVER": driver,
        "AGENT_DEVICES": '[{"id": "t01", "address": 1, "profile": "sim"}]',
    }
    assert printed_config(env=env)["devices"][0]["profile"] == "sim"
    unknown = {**env, "AGENT_DEVICES": '[{"id": "t01", "address": 1, "profile": "kc"}]'}
    result = run_agent(env=unknown)
    assert result.returncode == EXIT_CONFIG
    assert "AGENT_DEVICES (devices): device t01: no profile 'kc' (defined: sim)" in result.stderr


@pytest.mark.parametrize("where", ["environment", "env-file"])
@pytest.mark.parametrize("print_config", [False, True], ids=["start", "print-config"])
def test_a_misspelt_variable_exits_78_naming_the_setting_meant(
    tmp_path: Path, where: str, print_config: bool
) -> None:
    typo = {"AGENT_MQTT_PORT": "21883"}  # one underscore: the port would stay 1883
    env_file = tmp_path / "floor3.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in typo.items()))
    args = ["--env-file", str(env_file)] if where == "env-file" else []
    args += ["--print-config"] if print_config else []
    result = run_agent(*args, env={**BASE, **(typo if where == "environment" else {})})
    assert result.returncode == EXIT_CONFIG, result.stdout + result.stderr
    assert result.stderr == (
        "agent: invalid setting AGENT_MQTT_PORT: no such setting; did you mean AGENT_MQTT__PORT?\n"
    )
    assert result.stdout == ""


def test_the_names_systemd_and_the_tests_set_are_no_typo() -> None:
    env = {**BASE, "AGENT_LINE_ID": "thermostat-1", "AGENT_SOAK_SEED": "651"}
    assert printed_config(env=env)["line_id"] == "thermostat-1"
