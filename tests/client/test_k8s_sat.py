"""Kubernetes service account token authentication (MQTT 5 enhanced authentication, K8S-SAT).

The CONNECT that gmqtt sends is captured by a raw listener and read with the project's own
MQTT codec, so what is checked is what goes on the wire."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from pathlib import Path

import pytest

from agent.client.credentials import K8S_SAT, Credentials, exposed_secret, read_credentials
from agent.client.session import AuthenticationFailed, Session, SessionError
from agent.config import MqttSettings
from tests.client.conftest import LogWatch, RawBroker, RawBrokerFactory, fast_settings

CONNACK_SUCCESS = bytes([0x20, 0x03, 0x00, 0x00, 0x00])
TOKEN = b"eyJhbGciOiJSUzI1NiJ9.first-token.signature"
ROTATED = b"eyJhbGciOiJSUzI1NiJ9.rotated-token.signature"


def connack(reason: int, properties: bytes = b"") -> bytes:
    body = bytes([0x00, reason, len(properties)]) + properties
    return bytes([0x20, len(body)]) + body


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_bytes(TOKEN)
    return path


def rotate(path: Path, token: bytes) -> None:
    """As the kubelet does it: a new file, renamed over the old one."""
    staged = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    staged.write_bytes(token)
    os.replace(staged, path)


def session_for(broker: RawBroker, token_file: Path, **overrides: object) -> Session:
    settings = fast_settings(broker.port, sat_file=token_file, **overrides)
    return Session(settings, client_id=f"sat-{uuid.uuid4().hex[:8]}")


async def test_connect_carries_the_method_and_the_token(
    raw_broker: RawBrokerFactory, token_file: Path
) -> None:
    broker = await raw_broker(CONNACK_SUCCESS)
    session = session_for(broker, token_file)
    await session.start(timeout=5)
    await session.stop()
    connect = broker.connects[0].decoded()
    assert connect.properties.authentication_method == "K8S-SAT"
    assert connect.properties.authentication_data == TOKEN
    # No user name or password: the token is the credential.
    assert connect.username is None and connect.password is None
    assert connect.client_id == session.client_id


async def test_a_rotated_token_is_used_on_the_next_connect(
    raw_broker: RawBrokerFactory, token_file: Path
) -> None:
    broker = await raw_broker(CONNACK_SUCCESS)
    session = session_for(broker, token_file)
    await session.start(timeout=5)
    try:
        rotate(token_file, ROTATED + b"\n")  # a trailing newline is not part of the token
        broker.drop_clients()
        await broker.wait_for(lambda: len(broker.connects) == 2)
        await session.wait_connected(5)
    finally:
        await session.stop()
    first, second = (c.decoded().properties for c in broker.connects)
    assert first.authentication_data == TOKEN
    assert second.authentication_data == ROTATED
    assert second.authentication_method == "K8S-SAT"


async def test_an_unreadable_token_is_retried_until_it_is_back(
    raw_broker: RawBrokerFactory, token_file: Path, log_watch: LogWatch
) -> None:
    broker = await raw_broker(CONNACK_SUCCESS)
    session = session_for(broker, token_file)
    await session.start(timeout=5)
    try:
        await asyncio.to_thread(token_file.unlink)  # between two tokens, for a moment
        broker.drop_clients()
        record = await log_watch.wait_for("cannot read the service account token")
        assert record.levelno == logging.WARNING and str(token_file) in record.getMessage()
        assert not session.connected and session.error is None
        rotate(token_file, ROTATED)
        await session.wait_connected(5)
    finally:
        await session.stop()
    assert broker.connects[-1].decoded().properties.authentication_data == ROTATED
    assert len(broker.connects) == 2  # no CONNECT went out without a token


@pytest.mark.parametrize("reason", [0x87, 0x8C, 0x86])
async def test_a_refused_token_is_fatal_and_says_so(
    raw_broker: RawBrokerFactory, token_file: Path, reason: int
) -> None:
    broker = await raw_broker(connack(reason))
    session = session_for(broker, token_file)
    with pytest.raises(AuthenticationFailed, match="the broker refused the token") as raised:
        await session.start(timeout=5)
    assert raised.value.reason_code == reason and raised.value.fatal
    assert "mqtt.sat_file" in str(raised.value)
    assert TOKEN.decode() not in str(raised.value)
    assert len(broker.connects) == 1  # not retried


async def test_a_connack_that_carries_authentication_data_is_understood(
    raw_broker: RawBrokerFactory, token_file: Path
) -> None:
    # Without Authentication Data in gmqtt's property table, gmqtt drops such a connection
    # ("invalid property id").
    method = K8S_SAT.encode()
    properties = bytes([0x15, 0, len(method)]) + method + bytes([0x16, 0, 3]) + b"abc"
    broker = await raw_broker(connack(0x00, properties))
    session = session_for(broker, token_file)
    await session.start(timeout=5)
    try:
        assert session.connected
    finally:
        await session.stop()
    assert len(broker.connects) == 1


async def test_a_user_name_may_go_along(raw_broker: RawBrokerFactory, token_file: Path) -> None:
    broker = await raw_broker(CONNACK_SUCCESS)
    session = session_for(broker, token_file, username="edge-agent")
    await session.start(timeout=5)
    await session.stop()
    connect = broker.connects[0].decoded()
    assert (connect.username, connect.password) == ("edge-agent", None)
    assert connect.properties.authentication_data == TOKEN


def test_credentials_keep_secrets_out_of_their_repr(token_file: Path) -> None:
    credentials = read_credentials(MqttSettings(sat_file=token_file, username="u"))
    assert credentials == Credentials("u", None, "K8S-SAT", TOKEN)
    assert TOKEN.decode() not in repr(credentials)
    with_password = read_credentials(MqttSettings(username="u", password="pa55-word"))  # type: ignore[arg-type]
    assert with_password.password == "pa55-word" and "pa55-word" not in repr(with_password)


@pytest.mark.parametrize(("content", "problem"), [(b"", "is empty"), (b"x" * 65_536, "longer")])
def test_an_unusable_token_is_an_error_naming_the_setting(
    token_file: Path, content: bytes, problem: str
) -> None:
    token_file.write_bytes(content)
    with pytest.raises(SessionError, match=problem) as raised:
        read_credentials(MqttSettings(sat_file=token_file))
    assert "mqtt.sat_file" in str(raised.value)


def test_settings_refuse_a_missing_file_and_a_password_besides(token_file: Path) -> None:
    with pytest.raises(ValueError, match="file not found"):
        MqttSettings(sat_file=token_file.with_name("absent"))
    with pytest.raises(ValueError, match="either password or sat_file"):
        MqttSettings(sat_file=token_file, username="u", password="p")  # type: ignore[arg-type]


def test_a_secret_in_clear_text_across_the_network_is_noticed(token_file: Path) -> None:
    assert exposed_secret(MqttSettings(host="broker.example", sat_file=token_file)) == (
        "the service account token"
    )
    assert exposed_secret(
        MqttSettings(host="10.0.0.5", username="u", password="p")  # type: ignore[arg-type]
    ) == ("the password")
    assert exposed_secret(MqttSettings(host="127.0.0.1", sat_file=token_file)) is None
    assert exposed_secret(MqttSettings(host="localhost", sat_file=token_file)) is None
    assert exposed_secret(MqttSettings(host="::1", sat_file=token_file)) is None
    assert exposed_secret(MqttSettings(host="broker.example", username="u")) is None
    tls = {"enabled": True}
    assert exposed_secret(MqttSettings(host="b.example", sat_file=token_file, tls=tls)) is None  # type: ignore[arg-type]


async def test_the_clear_text_warning_is_logged(
    raw_broker: RawBrokerFactory, token_file: Path, log_watch: LogWatch
) -> None:
    # "localhost" resolves to the raw broker on 127.0.0.1 and counts as local: no warning.
    broker = await raw_broker(CONNACK_SUCCESS)
    session = session_for(broker, token_file)
    await session.start(timeout=5)
    await session.stop()
    assert not log_watch.matching("without TLS")
    # A name that is not loopback gets the warning (the connection itself may fail here).
    settings = MqttSettings(host="broker.invalid", port=broker.port, sat_file=token_file)
    remote = Session(settings, client_id="sat-remote")
    await remote.start(wait=False)
    try:
        record = await log_watch.wait_for("without TLS")
        assert "the service account token" in record.getMessage()
        assert TOKEN.decode() not in record.getMessage()
    finally:
        await remote.stop()
