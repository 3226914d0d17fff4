"""Every documented flag of `agent store` and of `agent` does what its help says.

`agent store` runs as a real process against real brokers; the agent's flags (generated from
its settings) are checked through --print-config, each against the setting it names, and its
MQTT flags end to end in tests/test_secrets.py."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import agent.cli
from agent.runtime import cli as agent_cli
from tests.client.conftest import Pki, RawBroker
from tests.support.processes import READY_URL, AgentProcess
from tests.support.secured_broker import SecuredMosquitto

USER, PASSWORD = "flag-user", "Flag-pa55word-7"
TOKEN = b"k8s-service-account-token-from-a-flag"
CONNACK_SUCCESS = bytes([0x20, 0x03, 0x00, 0x00, 0x00])


def clean_environment() -> dict[str, str]:
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("AGENT_") and name not in ("CREDENTIALS_DIRECTORY", "SSL_CERT_FILE")
    }


def store(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "store", *args],
        capture_output=True,
        text=True,
        env={**clean_environment(), **(env or {})},
        timeout=60,
    )


async def store_async(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`agent store` while this test's event loop keeps serving a raw broker."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "store", *args,
        env={**clean_environment(), **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, stderr.decode()


@pytest.fixture(scope="module")
def emulator() -> Iterator[tuple[str, str]]:
    process = AgentProcess(["emulator", "--port", "0"])
    match = process.wait_for(READY_URL)
    yield match.group(1), match.group(2)
    process.stop()


def connected_line(stderr: str) -> re.Match[str] | None:
    return re.search(r"MQTT client (\S+) connected to (\S+) \((MQTT 5[^)]*)\)", stderr)


# --- agent store -----------------------------------------------------------------------------

# Each connection flag of `agent store --help`, and the test(s) that show it working.
STORE_FLAGS = {
    "--env-file": "tests/ops/test_line_env.py::test_env_file_flag_under_the_environment",
    "--host": "test_host_and_port_flags_win_over_the_environment",
    "--port": "test_host_and_port_flags_win_over_the_environment",
    "--client-id": "test_client_id_flag",
    "--username": "test_username_and_password_file_flags",
    "--password-file": "test_username_and_password_file_flags",
    "--sat-file": "test_sat_file_flag",
    "--tls": "test_tls_flag_uses_the_system_trust_store",
    "--ca-file": "test_tls.py::test_agent_store_gets_through[server-verified]",
    "--cert-file": "test_tls.py::test_agent_store_gets_through[mutual]",
    "--key-file": "test_tls.py::test_agent_store_gets_through[mutual]",
    "--key-password-file": "test_tls.py::test_agent_store_gets_through[mutual-encrypted-key]",
    "--timeout": "test_timeout_flag_bounds_the_retries",
    "--log-level": "test_client_id_flag",
}


def store_connection_flags() -> set[str]:
    parser = agent.cli.build_parser("store")
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    store_parser = subcommands.choices["store"]
    group = next(g for g in store_parser._action_groups if g.title and "connection" in g.title)
    return {flag for action in group._group_actions for flag in action.option_strings}


def test_every_connection_flag_of_agent_store_is_tested() -> None:
    assert store_connection_flags() == set(STORE_FLAGS)
    names = {name for name in globals() if name.startswith("test_")}
    for test in STORE_FLAGS.values():
        if "::" not in test:
            assert test in names, test


def test_host_and_port_flags_win_over_the_environment(emulator: tuple[str, str]) -> None:
    host, port = emulator
    env = {"AGENT_MQTT__HOST": "no-such-host.invalid", "AGENT_MQTT__PORT": "1"}
    assert store("--host", host, "--port", port, "set", "flag-k", "v", env=env).returncode == 0
    # The flags also work after the command.
    got = store("get", "flag-k", "--host", host, "--port", port, env=env)
    assert (got.returncode, got.stdout) == (0, "v\n"), got.stderr
    # And the environment is what is used without them.
    refused = store("get", "flag-k", env=env)
    assert refused.returncode == 4 and "no-such-host.invalid" in refused.stderr


def test_client_id_flag(emulator: tuple[str, str]) -> None:
    host, port = emulator
    result = store(
        "--host", host, "--port", port, "--client-id", "flag-client-7", "--log-level", "INFO",
        "get", "absent",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    line = connected_line(result.stderr)
    assert line is not None and line.group(1) == "flag-client-7", result.stderr
    quiet = store("--host", host, "--port", port, "get", "absent")  # --log-level ERROR
    assert quiet.returncode == 1 and quiet.stderr == ""
    invalid = store("--host", host, "--port", port, "--client-id", "a/b", "get", "absent")
    assert invalid.returncode == 2 and "--client-id: client id must not contain '/'" in (
        invalid.stderr
    )


def test_username_and_password_file_flags(
    pki: Pki, secured: Callable[..., SecuredMosquitto], tmp_path: Path
) -> None:
    broker = secured(pki, users={USER: PASSWORD})
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")  # the trailing newline is not part of it
    common = ["--host", "127.0.0.1", "--port", str(broker.port), "--ca-file", str(pki.ca)]
    accepted = store(
        *common, "--username", USER, "--password-file", str(password_file),
        "--timeout", "1", "--log-level", "INFO", "get", "k",
    )  # fmt: skip
    assert connected_line(accepted.stderr) is not None, accepted.stderr
    password_file.write_text("wrong\n")
    refused = store(*common, "--username", USER, "--password-file", str(password_file), "get", "k")
    # Was: gmqtt's ERROR lines first, then "check mqtt.username, mqtt.password ...".
    assert refused.returncode == 4
    [line] = refused.stderr.splitlines()  # mosquitto says 0x87 (not authorized)
    assert line.startswith(f"agent store: cannot connect to 127.0.0.1:{broker.port}: "), line
    assert line.endswith(
        "check --username, --password-file and the client certificate (--cert-file)"
    ), line
    from_environment = store(
        *common, "get", "k", env={"AGENT_MQTT__USERNAME": USER, "AGENT_MQTT__PASSWORD": "wrong"}
    )
    assert "check AGENT_MQTT__USERNAME, AGENT_MQTT__PASSWORD and" in from_environment.stderr
    # Was: taken for --password-file, and the password said as the file it could not read.
    as_a_flag = store(*common, "--username", USER, "--password", PASSWORD, "get", "k")
    assert as_a_flag.returncode == 2
    assert as_a_flag.stderr.splitlines() == [
        "agent store: --password: a secret is never a flag (process listings show flags): "
        "put it in a file for --password-file, or in AGENT_MQTT__PASSWORD"
    ]
    missing = store(*common, "--username", USER, "--password-file", str(tmp_path / "absent"))
    assert missing.returncode == 2
    unreadable = store(
        *common, "--username", USER, "--password-file", str(tmp_path / "absent"), "get", "k"
    )
    assert unreadable.returncode == 2 and "cannot read --password-file" in unreadable.stderr
    for result in (accepted, refused, unreadable, as_a_flag):
        assert PASSWORD not in result.stdout + result.stderr


async def test_sat_file_flag(raw_broker: Callable[..., Any], tmp_path: Path) -> None:
    broker: RawBroker = await raw_broker(CONNACK_SUCCESS)
    token_file = tmp_path / "token"
    token_file.write_bytes(TOKEN)
    code, stderr = await store_async(
        "--host", "127.0.0.1", "--port", str(broker.port), "--sat-file", str(token_file),
        "--timeout", "1", "get", "k",
    )  # fmt: skip
    assert code == 4 and "GET got no response within 1 s" in stderr  # no state store there
    connect = broker.connects[0].decoded()
    assert connect.properties.authentication_method == "K8S-SAT"
    assert connect.properties.authentication_data == TOKEN
    assert TOKEN.decode() not in stderr
    code, stderr = await store_async("--sat-file", str(tmp_path / "absent"), "get", "k")
    assert code == 2 and "--sat-file: file not found" in stderr


def test_tls_flag_uses_the_system_trust_store(
    pki: Pki, secured: Callable[..., SecuredMosquitto]
) -> None:
    broker = secured(pki)
    args = ["--host", "127.0.0.1", "--port", str(broker.port), "--tls", "get", "k"]
    # Our test CA is not among the system's CAs: the broker is not trusted...
    untrusted = store(*args)
    assert untrusted.returncode == 4 and "certificate does not verify" in untrusted.stderr
    # ...unless OpenSSL's default trust store is pointed at it.
    trusted = store(
        "--timeout", "1", "--log-level", "INFO", *args, env={"SSL_CERT_FILE": str(pki.ca)}
    )
    line = connected_line(trusted.stderr)
    assert line is not None and "TLS" in line.group(3), trusted.stderr
    # --tls before the command is not reset by the command's own options.
    assert "GET got no response within 1 s" in trusted.stderr


async def test_timeout_flag_bounds_the_retries(raw_broker: Callable[..., Any]) -> None:
    broker: RawBroker = await raw_broker(None)  # accepts, never answers CONNECT
    code, stderr = await store_async(
        "--host", "127.0.0.1", "--port", str(broker.port), "--timeout", "1.5", "get", "k",
        env={
            "AGENT_MQTT__CONNECT_TIMEOUT_S": "0.3",
            "AGENT_MQTT__RECONNECT_MIN_S": "0.05",
            "AGENT_MQTT__RECONNECT_MAX_S": "0.1",
        },
    )  # fmt: skip
    assert code == 4
    assert f"could not connect to 127.0.0.1:{broker.port} within 1.5 s" in stderr, stderr
    assert "no CONNACK within 0.3 s" in stderr
    assert len(broker.connects) >= 2  # timeouts are retried, even for a one-shot command


def test_connection_flags_are_named_in_their_errors(tmp_path: Path) -> None:
    result = store("--port", "70000", "get", "k")
    assert result.returncode == 2 and "--port: Input should be less than or equal to 65535" in (
        result.stderr
    )
    env_result = store("get", "k", env={"AGENT_MQTT__PORT": "70000"})
    assert env_result.returncode == 2 and "AGENT_MQTT__PORT (mqtt.port)" in env_result.stderr
    result = store("--ca-file", str(tmp_path / "absent.pem"), "get", "k")
    assert result.returncode == 2 and "--ca-file: file not found" in result.stderr
    junk = tmp_path / "junk.pem"
    junk.write_text("junk\n")
    result = store("--ca-file", str(junk), "get", "k")
    assert result.returncode == 2 and f"cannot use --ca-file {junk}" in result.stderr
    assert "Traceback" not in result.stderr
    env_result = store("get", "k", env={"AGENT_MQTT__TLS__CA_FILE": str(junk)})
    assert f"cannot use AGENT_MQTT__TLS__CA_FILE {junk}" in env_result.stderr


# --- agent -----------------------------------------------------------------------------------


def _files(tmp_path: Path) -> dict[str, Path]:
    files = {}
    for name in ("ca.pem", "cert.pem", "key.pem", "token"):
        files[name] = tmp_path / name
        files[name].write_text("x")
    return files


def agent_flag_samples(tmp_path: Path) -> dict[str, tuple[str, Any]]:
    """Every setting flag of `agent`: a value to give and what --print-config then shows."""
    files = _files(tmp_path)
    profiles = tmp_path / "profiles.json"
    profiles.write_text("{}")
    return {
        "--device-id": ("boiler-7", "boiler-7"),
        "--profiles-file": (str(profiles), str(profiles)),
        "--line-id": ("boiler-room", "boiler-room"),
        "--instance-id": ("b", "b"),
        "--state-dir": (str(tmp_path / "state"), str(tmp_path / "state")),
        "--reconcile-interval-s": ("12.5", 12.5),
        "--log-level": ("DEBUG", "DEBUG"),
        "--keys-setpoint": ("{device}/sp", "{device}/sp"),
        "--keys-lock": ("{line}/lk", "{line}/lk"),
        "--keys-synced": ("{device}/sy", "{device}/sy"),
        "--keys-line": ("{device}/ln", "{device}/ln"),
        "--keys-point": ("{device}/p/{point}", "{device}/p/{point}"),
        "--mqtt-host": ("broker.example", "broker.example"),
        "--mqtt-port": ("8883", 8883),
        "--mqtt-client-id": ("edge-9", "edge-9"),
        "--mqtt-username": ("edge", "edge"),
        "--mqtt-sat-file": (str(files["token"]), str(files["token"])),
        "--mqtt-keepalive-s": ("25", 25),
        "--mqtt-connect-timeout-s": ("3.5", 3.5),
        "--mqtt-reconnect-min-s": ("0.25", 0.25),
        "--mqtt-reconnect-max-s": ("5", 5.0),
        "--mqtt-request-timeout-s": ("7", 7.0),
        "--mqtt-max-inflight": ("33", 33),
        "--mqtt-tls-enabled": ("true", True),
        "--mqtt-tls-ca-file": (str(files["ca.pem"]), str(files["ca.pem"])),
        "--mqtt-tls-cert-file": (str(files["cert.pem"]), str(files["cert.pem"])),
        "--mqtt-tls-key-file": (str(files["key.pem"]), str(files["key.pem"])),
        "--serial-driver": ("modbus", "modbus"),
        "--serial-url": ("socket://10.0.0.9:4001", "socket://10.0.0.9:4001"),
        "--serial-baudrate": ("19200", 19200),
        "--serial-parity": ("E", "E"),
        "--serial-bytesize": ("7", 7),
        "--serial-stopbits": ("2", 2),
        "--serial-reply-timeout-s": ("0.75", 0.75),
        "--serial-min-write-interval-s": ("2", 2.0),
        "--serial-poll-interval-s": ("3", 3.0),
        "--serial-extra-gap-s": ("0.01", 0.01),
        "--serial-probe-interval-s": ("15", 15.0),
        "--serial-after-absence": ("unit", "unit"),
        "--serial-lock-dir": (str(tmp_path), str(tmp_path)),
        "--serial-modbus-unit-id": ("17", 17),
        "--serial-modbus-setpoint-register": ("40", 40),
        "--serial-modbus-temperature-register": ("41", 41),
        "--serial-modbus-scale": ("100", 100.0),
        "--serial-modbus-signed": ("false", False),
        "--serial-modbus-read-function": ("4", 4),
        "--serial-modbus-write-function": ("16", 16),
        "--lock-ttl-ms": ("4500", 4500),
        "--lock-safety-margin-ms": ("200", 200),
        "--telemetry-interval-s": ("30", 30.0),
        "--telemetry-topic": ("plant/{device}/t", "plant/{device}/t"),
        "--telemetry-jitter-s": ("0.5", 0.5),
        "--telemetry-line-topic": ("plant/{line}/t", "plant/{line}/t"),
        "--keys-paused": ("{line}/pz", "{line}/pz"),
        "--keys-switchover": ("{line}/so", "{line}/so"),
        "--keys-history": ("{line}/hi", "{line}/hi"),
        "--health-topic": ("plant/{line}/{instance}/h", "plant/{line}/{instance}/h"),
        "--health-device-topic": ("plant/{device}/s", "plant/{device}/s"),
        "--health-availability-topic": ("plant/{device}/a", "plant/{device}/a"),
        "--health-interval-s": ("2", 2.0),
        "--health-host": ("0.0.0.0", "0.0.0.0"),
        "--health-port": ("8008", 8008),
        "--health-metrics": ("false", False),
    }


def line_flag_samples(tmp_path: Path) -> dict[str, tuple[str, Any]]:
    """The devices of a line: each instead of --device-id (they exclude one another)."""
    devices_file = tmp_path / "devices.json"
    devices_file.write_text('[{"id": "t1", "address": 1}]')
    return {
        "--devices": ("t1@1,t2@2", [_device("t1", 1), _device("t2", 2)]),
        "--devices-file": (str(devices_file), str(devices_file)),
    }


def _device(name: str, address: int) -> dict[str, Any]:
    return {
        "id": name,
        "address": address,
        "min_write_interval_s": None,
        "modbus": None,
        "profile": None,
    }


def agent_setting_flags() -> dict[str, str]:
    """Flag -> settings path, as `agent --help` documents them."""
    parser = agent_cli.build_parser()
    return {
        action.option_strings[0]: action.dest.removeprefix("setting:")
        for action in parser._actions
        if action.dest.startswith("setting:")
    }


def test_every_setting_flag_of_agent_has_a_sample(tmp_path: Path) -> None:
    samples = {**agent_flag_samples(tmp_path), **line_flag_samples(tmp_path)}
    assert set(agent_setting_flags()) == set(samples)


@pytest.fixture
def no_agent_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("AGENT_") or name in (
            "CREDENTIALS_DIRECTORY",
            "STATE_DIRECTORY",
        ):
            monkeypatch.delenv(name)


def test_every_setting_flag_of_agent_sets_its_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_agent_environment: None
) -> None:
    samples = agent_flag_samples(tmp_path)
    paths = agent_setting_flags()
    argv = ["--print-config"]
    for flag, (value, _) in samples.items():
        argv += [flag, value]
    assert agent_cli.main(argv) == 0, capsys.readouterr().err
    config = json.loads(capsys.readouterr().out)
    for flag, (_, expected) in samples.items():
        node: Any = config
        for part in paths[flag].split("."):
            node = node[part]
        assert node == expected, flag
    for flag, (value, expected) in line_flag_samples(tmp_path).items():
        argv = ["--print-config", "--line-id", "l", "--serial-url", "socket://x:1", flag, value]
        assert agent_cli.main(argv) == 0, capsys.readouterr().err
        config = json.loads(capsys.readouterr().out)
        assert config[paths[flag]] == expected, flag
    # Files given as flags turn TLS on, as the variables do (and as agent store's flags do).
    assert (
        agent_cli.main(
            ["--print-config", "--simulate", "--mqtt-tls-ca-file", str(tmp_path / "ca.pem")]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["mqtt"]["tls"]["enabled"] is True


@pytest.mark.parametrize(
    ("flag", "value", "variable"),
    [
        ("--mqtt-port", "0", "AGENT_MQTT__PORT"),
        ("--mqtt-tls-ca-file", "/nonexistent/ca.pem", "AGENT_MQTT__TLS__CA_FILE"),
        ("--mqtt-sat-file", "/nonexistent/token", "AGENT_MQTT__SAT_FILE"),
        ("--mqtt-client-id", "a#b", "AGENT_MQTT__CLIENT_ID"),
        ("--mqtt-tls-cert-file", __file__, "AGENT_MQTT__TLS"),  # without its key file
    ],
)
def test_an_invalid_agent_flag_exits_78_naming_the_setting(
    flag: str,
    value: str,
    variable: str,
    capsys: pytest.CaptureFixture[str],
    no_agent_environment: None,
) -> None:
    assert agent_cli.main(["--print-config", "--simulate", flag, value]) == 78
    assert f"invalid setting {variable} " in capsys.readouterr().err
