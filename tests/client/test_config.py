"""MQTT connection settings: environment variables, validation messages, secrets."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.config import (
    ConnectionSettings,
    MqttSettings,
    TlsSettings,
    check_client_id,
    default_client_id,
    redacted,
)

PASSWORD = "hunter2-very-secret"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No AGENT_* variable of the machine running the tests leaks in."""
    for name in list(os.environ):
        if name.upper().startswith("AGENT_"):
            monkeypatch.delenv(name)
    yield


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    path = tmp_path / "file.pem"
    path.write_text("not parsed here")
    return path


def error_text(excinfo: pytest.ExceptionInfo[ValidationError]) -> str:
    return str(excinfo.value)


def test_defaults() -> None:
    mqtt = ConnectionSettings().mqtt
    assert (mqtt.host, mqtt.port, mqtt.client_id, mqtt.username, mqtt.password) == (
        "localhost",
        1883,
        None,
        None,
        None,
    )
    assert mqtt.keepalive_s == 10
    assert (mqtt.connect_timeout_s, mqtt.request_timeout_s) == (10.0, 10.0)
    assert (mqtt.reconnect_min_s, mqtt.reconnect_max_s) == (0.5, 30.0)
    assert mqtt.max_inflight == 100
    assert mqtt.tls == TlsSettings() and not mqtt.tls.enabled


def test_nested_environment_variables(monkeypatch: pytest.MonkeyPatch, pem: Path) -> None:
    environment = {
        "AGENT_MQTT__HOST": "broker.example",
        "AGENT_MQTT__PORT": "8883",
        "AGENT_MQTT__CLIENT_ID": "agent-dev1-0",
        "AGENT_MQTT__USERNAME": "edge",
        "AGENT_MQTT__PASSWORD": PASSWORD,
        "AGENT_MQTT__KEEPALIVE_S": "15",
        "AGENT_MQTT__RECONNECT_MIN_S": "0.25",
        "AGENT_MQTT__RECONNECT_MAX_S": "5",
        "AGENT_MQTT__MAX_INFLIGHT": "10",
        "AGENT_MQTT__TLS__CA_FILE": str(pem),
        "AGENT_MQTT__TLS__CERT_FILE": str(pem),
        "AGENT_MQTT__TLS__KEY_FILE": str(pem),
        "AGENT_MQTT__TLS__KEY_PASSWORD": "key-secret",
        "AGENT_UNRELATED": "ignored",  # other parts of the agent have their own variables
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    mqtt = ConnectionSettings().mqtt
    assert (mqtt.host, mqtt.port, mqtt.client_id, mqtt.username) == (
        "broker.example",
        8883,
        "agent-dev1-0",
        "edge",
    )
    assert mqtt.password is not None and mqtt.password.get_secret_value() == PASSWORD
    assert (mqtt.keepalive_s, mqtt.reconnect_min_s, mqtt.reconnect_max_s) == (15, 0.25, 5.0)
    assert mqtt.max_inflight == 10
    assert mqtt.tls.enabled  # implied by the files
    assert mqtt.tls.ca_file == mqtt.tls.cert_file == mqtt.tls.key_file == pem
    assert mqtt.tls.key_password is not None
    assert mqtt.tls.key_password.get_secret_value() == "key-secret"


def test_environment_names_are_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("agent_mqtt__host", "lower.example")
    assert ConnectionSettings().mqtt.host == "lower.example"


def test_a_mistyped_mqtt_variable_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_MQTT__HOTS", "typo.example")
    with pytest.raises(ValidationError) as raised:
        ConnectionSettings()
    assert "mqtt.hots" in error_text(raised)


@pytest.mark.parametrize(
    ("variable", "value", "location", "text"),
    [
        ("AGENT_MQTT__PORT", "0", "mqtt.port", "greater than or equal to 1"),
        ("AGENT_MQTT__PORT", "65536", "mqtt.port", "less than or equal to 65535"),
        ("AGENT_MQTT__PORT", "http", "mqtt.port", "valid integer"),
        ("AGENT_MQTT__KEEPALIVE_S", "0", "mqtt.keepalive_s", "greater than or equal to 1"),
        ("AGENT_MQTT__CONNECT_TIMEOUT_S", "0", "mqtt.connect_timeout_s", "greater than 0"),
        ("AGENT_MQTT__MAX_INFLIGHT", "0", "mqtt.max_inflight", "greater than or equal to 1"),
        ("AGENT_MQTT__HOST", "", "mqtt.host", "at least 1 character"),
        ("AGENT_MQTT__CLIENT_ID", "a/b", "mqtt.client_id", "must not contain '/'"),
        ("AGENT_MQTT__CLIENT_ID", "a+b", "mqtt.client_id", "must not contain '+'"),
        ("AGENT_MQTT__TLS__CA_FILE", "/nonexistent/ca.pem", "mqtt.tls.ca_file", "file not found"),
        ("AGENT_MQTT__SAT_FILE", "/nonexistent/token", "mqtt.sat_file", "file not found"),
    ],
)
def test_validation_errors_name_the_setting(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, location: str, text: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as raised:
        ConnectionSettings()
    message = error_text(raised)
    assert f"\n{location}\n" in message, message
    assert text in message


def test_reconnect_bounds_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match=r"reconnect_min_s \(5\.0\) must not exceed"):
        MqttSettings(reconnect_min_s=5, reconnect_max_s=1)
    assert MqttSettings(reconnect_min_s=2, reconnect_max_s=2).reconnect_max_s == 2


def test_password_needs_a_username() -> None:
    with pytest.raises(ValidationError, match="password is set but username is not"):
        MqttSettings(password=PASSWORD)  # type: ignore[arg-type]


def test_certificate_and_key_go_together(pem: Path) -> None:
    with pytest.raises(ValidationError, match=r"tls\.cert_file and tls\.key_file"):
        TlsSettings(cert_file=pem)
    with pytest.raises(ValidationError, match=r"tls\.cert_file and tls\.key_file"):
        TlsSettings(key_file=pem)
    with pytest.raises(ValidationError, match=r"tls\.key_password is set"):
        TlsSettings(key_password="x")  # type: ignore[arg-type]


def test_tls_files_imply_tls_unless_explicitly_disabled(pem: Path) -> None:
    assert TlsSettings(ca_file=pem).enabled
    assert TlsSettings(enabled=True).enabled  # system trust store
    with pytest.raises(ValidationError, match=r"tls\.enabled is false but tls\.ca_file is set"):
        TlsSettings(enabled=False, ca_file=pem)


def test_secrets_never_show(monkeypatch: pytest.MonkeyPatch, pem: Path) -> None:
    monkeypatch.setenv("AGENT_MQTT__USERNAME", "edge")
    monkeypatch.setenv("AGENT_MQTT__PASSWORD", PASSWORD)
    monkeypatch.setenv("AGENT_MQTT__TLS__CERT_FILE", str(pem))
    monkeypatch.setenv("AGENT_MQTT__TLS__KEY_FILE", str(pem))
    monkeypatch.setenv("AGENT_MQTT__TLS__KEY_PASSWORD", "key-" + PASSWORD)
    settings = ConnectionSettings()
    for text in (
        repr(settings),
        str(settings),
        repr(settings.mqtt),
        settings.model_dump_json(),
        str(settings.model_dump()),
        str(redacted(settings)),
    ):
        assert PASSWORD not in text
        assert "**********" in text
    assert redacted(settings)["mqtt"]["password"] == "**********"


def test_a_secret_in_a_validation_error_is_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_MQTT__PASSWORD", PASSWORD)  # but no user name
    with pytest.raises(ValidationError) as raised:
        ConnectionSettings()
    assert PASSWORD not in error_text(raised)


def test_default_client_id_is_stable_unique_and_valid() -> None:
    assert default_client_id("dev1", "0") == "agent-dev1-0"
    assert default_client_id("dev1", "0") == default_client_id("dev1", "0")
    assert default_client_id("dev1", "0") != default_client_id("dev1", "1")
    # Unsafe characters are replaced, with a hash keeping ids apart that differ only in them.
    spaced, slashed = default_client_id("dev 1", "0"), default_client_id("dev/1", "0")
    assert spaced != slashed
    for client_id in (spaced, slashed):
        assert client_id.startswith("agent-dev-1-0-")
        check_client_id(client_id)
    long = default_client_id("d" * 200, "0")
    assert len(long) <= 64 and long != default_client_id("d" * 200, "1")
    with pytest.raises(ValueError):
        default_client_id("", "0")


@pytest.mark.parametrize("client_id", ["", "a#", "a\nb", "x" * 257])
def test_invalid_client_ids(client_id: str) -> None:
    with pytest.raises(ValueError):
        check_client_id(client_id)
