"""TLS and mutual TLS end to end, against mosquitto with certificates made for the test.

Every case is checked the three ways a client meets it: a one-shot command (``agent store``,
and ``Session.start(fail_fast=True)`` under it) gets a clear error at once and exit 4; the
long-running session retries cleanly, saying why each time; what is accepted works."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.client.session import (
    AuthenticationFailed,
    ConnectFailed,
    Message,
    Session,
)
from agent.client.tls import TlsSetupFailed, build_ssl_context
from agent.config import AgentSettings, TlsSettings
from tests.client.conftest import KEY_PASSWORD, LogWatch, Pki, fast_settings
from tests.support.secured_broker import SecuredMosquitto

USER, PASSWORD = "edge-agent", "Tls-pa55word-42"


@dataclass(frozen=True)
class Case:
    """A broker, a client's TLS settings, and what must happen."""

    broker: dict[str, Any]
    client: dict[str, str]  # TlsSettings field -> name of a Pki attribute
    refusal: str | None  # what the error says (a pattern), or None when accepted


CASES = {
    "server-verified": Case({}, {"ca_file": "ca"}, None),
    "mutual": Case(
        {"require_certificate": True},
        {"ca_file": "ca", "cert_file": "client_cert", "key_file": "client_key"},
        None,
    ),
    "mutual-encrypted-key": Case(
        {"require_certificate": True},
        {"ca_file": "ca", "cert_file": "client_cert", "key_file": "client_key_encrypted"},
        None,
    ),
    "wrong-ca": Case(
        {}, {"ca_file": "other_ca"}, "certificate does not verify: self-signed certificate"
    ),
    "expired-server-certificate": Case(
        {"server_cert": "server_expired_cert"},
        {"ca_file": "ca"},
        "certificate does not verify: certificate has expired",
    ),
    "wrong-host-name": Case(
        {"server_cert": "server_other_host_cert"},
        {"ca_file": "ca"},
        "certificate does not verify: IP address mismatch",
    ),
    "no-client-certificate": Case(
        {"require_certificate": True},
        {"ca_file": "ca"},
        "require(s)? a client certificate",
    ),
    "client-certificate-of-another-ca": Case(
        {"require_certificate": True},
        {"ca_file": "ca", "cert_file": "other_client_cert", "key_file": "client_key"},
        "(refused|accept) the client certificate",
    ),
    # Was: a hang-up before CONNACK, retried until the wait was over, then "a TLS port?".
    "plain-client-on-a-tls-port": Case(
        {}, {}, "the port speaks TLS, and this client connected without it"
    ),
}
ACCEPTED = [name for name, case in CASES.items() if case.refusal is None]
REFUSED = [name for name, case in CASES.items() if case.refusal is not None]


def broker_for(
    case: Case, pki: Pki, secured: Callable[..., SecuredMosquitto], **extra: Any
) -> SecuredMosquitto:
    options = dict(case.broker)
    if "server_cert" in options:
        options["server_cert"] = getattr(pki, options["server_cert"])
    return secured(pki, **options, **extra)


def tls_settings(case: Case, pki: Pki) -> dict[str, Any]:
    tls: dict[str, Any] = {field: getattr(pki, name) for field, name in case.client.items()}
    if tls.get("key_file") == pki.client_key_encrypted:
        tls["key_password"] = KEY_PASSWORD
    return tls


# --- The session: one-shot and long-running -------------------------------------------------


@pytest.mark.parametrize("name", ACCEPTED)
async def test_accepted(name: str, pki: Pki, secured: Callable[..., SecuredMosquitto]) -> None:
    case = CASES[name]
    broker = broker_for(case, pki, secured)
    session = Session(fast_settings(broker.port, tls=tls_settings(case, pki)))
    await session.start(timeout=10, fail_fast=True)
    try:
        received: asyncio.Queue[Message] = asyncio.Queue()
        await session.subscribe("tls/x", received.put_nowait)
        await session.publish("tls/x", b"secure")
        assert (await asyncio.wait_for(received.get(), 5)).payload == b"secure"
    finally:
        await session.stop()


@pytest.mark.parametrize("name", REFUSED)
async def test_refused_at_once_when_someone_waits(
    name: str, pki: Pki, secured: Callable[..., SecuredMosquitto]
) -> None:
    case = CASES[name]
    broker = broker_for(case, pki, secured)
    session = Session(fast_settings(broker.port, tls=tls_settings(case, pki)))
    # A timeout far off: the refusal must end the wait, not the timeout.
    with pytest.raises(ConnectFailed) as raised:
        await session.start(timeout=60, fail_fast=True)
    assert case.refusal is not None and re.search(case.refusal, str(raised.value))
    assert session.error is raised.value


@pytest.mark.parametrize("name", REFUSED)
async def test_refused_is_retried_by_the_long_running_session(
    name: str, pki: Pki, secured: Callable[..., SecuredMosquitto], log_watch: LogWatch
) -> None:
    case = CASES[name]
    broker = broker_for(case, pki, secured)
    session = Session(fast_settings(broker.port, tls=tls_settings(case, pki)))
    await session.start(wait=False)
    try:
        assert case.refusal is not None
        retries = await log_watch.wait_for_count("retrying in", 2, within=10)
        for record in retries:
            assert record.levelno == logging.WARNING
            assert re.search(case.refusal, record.getMessage())
        assert session.error is None and not session.connected  # still trying
    finally:
        await session.stop()
    await asyncio.wait_for(session.wait_closed(), 5)


async def test_a_long_running_session_gets_through_once_the_broker_is_fixed(
    pki: Pki, secured: Callable[..., SecuredMosquitto], log_watch: LogWatch
) -> None:
    # An expired broker certificate is replaced while the agent keeps trying.
    expired = broker_for(CASES["expired-server-certificate"], pki, secured)
    session = Session(fast_settings(expired.port, tls={"ca_file": pki.ca}))
    await session.start(wait=False)
    try:
        await log_watch.wait_for("certificate has expired")
        expired.stop()
        fixed = SecuredMosquitto(pki, port=expired.port)
        await asyncio.to_thread(fixed.start)
        try:
            await session.wait_connected(10)
        finally:
            fixed.stop()
    finally:
        await session.stop()


# --- User name and password over TLS ---------------------------------------------------------


async def test_user_name_and_password_over_mutual_tls(
    pki: Pki, secured: Callable[..., SecuredMosquitto]
) -> None:
    broker = secured(pki, require_certificate=True, users={USER: PASSWORD})
    tls = tls_settings(CASES["mutual-encrypted-key"], pki)
    session = Session(fast_settings(broker.port, tls=tls, username=USER, password=PASSWORD))
    await session.start(timeout=10, fail_fast=True)
    await session.stop()

    wrong = Session(fast_settings(broker.port, tls=tls, username=USER, password="not-it"))
    with pytest.raises(AuthenticationFailed, match="refused the credentials") as raised:
        await wrong.start(timeout=60)  # fatal for the long-running session too: no retry
    assert "not-it" not in str(raised.value)


async def test_password_and_key_passphrase_from_systemd_credentials(
    pki: Pki,
    secured: Callable[..., SecuredMosquitto],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The agent's own settings path: LoadCredential= files in $CREDENTIALS_DIRECTORY.
    broker = secured(pki, require_certificate=True, users={USER: PASSWORD})
    (tmp_path / "mqtt-password").write_text(PASSWORD + "\n")
    (tmp_path / "mqtt-key-password").write_text(KEY_PASSWORD + "\n")
    for name in [n for n in os.environ if n.upper().startswith("AGENT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    settings = AgentSettings(
        device_id="thermostat-1",
        mqtt={  # type: ignore[arg-type]
            "host": "127.0.0.1",
            "port": broker.port,
            "username": USER,
            "tls": {
                "ca_file": pki.ca,
                "cert_file": pki.client_cert,
                "key_file": pki.client_key_encrypted,
            },
        },
    )
    assert settings.mqtt.password is not None and settings.mqtt.tls.key_password is not None
    session = Session(settings.mqtt, client_id=settings.client_id)
    await session.start(timeout=10, fail_fast=True)
    await session.stop()


# --- The context itself ----------------------------------------------------------------------


def test_ssl_context_from_settings(pki: Pki) -> None:
    assert build_ssl_context(TlsSettings()) is None
    context = build_ssl_context(TlsSettings(ca_file=pki.ca))
    assert context is not None
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    assert build_ssl_context(
        TlsSettings(
            ca_file=pki.ca,
            cert_file=pki.client_cert,
            key_file=pki.client_key_encrypted,
            key_password=KEY_PASSWORD,  # type: ignore[arg-type]
        )
    )


def test_encrypted_key_without_or_with_a_wrong_password(pki: Pki) -> None:
    # Never an interactive OpenSSL prompt: a clear error naming the setting instead.
    with pytest.raises(TlsSetupFailed, match="key_password"):
        build_ssl_context(TlsSettings(cert_file=pki.client_cert, key_file=pki.client_key_encrypted))
    with pytest.raises(TlsSetupFailed, match=r"mqtt\.tls\.cert_file") as raised:
        build_ssl_context(
            TlsSettings(
                cert_file=pki.client_cert,
                key_file=pki.client_key_encrypted,
                key_password="wrong-secret",  # type: ignore[arg-type]
            )
        )
    assert "wrong-secret" not in str(raised.value)


@pytest.mark.parametrize("field", ["ca_file", "cert_file"])
def test_files_that_are_not_pem_name_the_setting(pki: Pki, tmp_path: Path, field: str) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    tls = {"ca_file": pki.ca, "cert_file": pki.client_cert, "key_file": pki.client_key}
    tls[field] = junk
    with pytest.raises(TlsSetupFailed, match=rf"mqtt\.tls\.{field} {junk}"):
        build_ssl_context(TlsSettings(**tls))  # type: ignore[arg-type]


# --- agent store, as a person runs it --------------------------------------------------------


def store(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "store", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )


def tls_flags(case: Case, pki: Pki, directory: Path) -> list[str]:
    flags = []
    for field, value in tls_settings(case, pki).items():
        if field == "key_password":
            password_file = directory / f"key-password-{uuid.uuid4().hex[:6]}"
            password_file.write_text(value + "\n")
            flags += ["--key-password-file", str(password_file)]
        else:
            flags += ["--" + field.replace("_", "-"), str(value)]
    return flags


@pytest.mark.parametrize("name", REFUSED)
def test_agent_store_exits_4_at_once_with_the_reason(
    name: str, pki: Pki, secured: Callable[..., SecuredMosquitto], tmp_path: Path
) -> None:
    case = CASES[name]
    broker = broker_for(case, pki, secured)
    result = store(
        {},
        "--host", "127.0.0.1", "--port", str(broker.port), "--timeout", "60",
        *tls_flags(case, pki, tmp_path),
        "get", "k",
    )  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert case.refusal is not None and re.search(case.refusal, result.stderr)
    assert result.stderr.startswith(f"agent store: cannot connect to 127.0.0.1:{broker.port}: ")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ACCEPTED)
def test_agent_store_gets_through(
    name: str, pki: Pki, secured: Callable[..., SecuredMosquitto], tmp_path: Path
) -> None:
    # No state store runs on this broker: connected, the request times out (exit 4 too, but
    # after the CONNACK, which the INFO log line shows).
    case = CASES[name]
    broker = broker_for(case, pki, secured)
    result = store(
        {},
        "--host", "127.0.0.1", "--port", str(broker.port), "--timeout", "1",
        "--log-level", "INFO", *tls_flags(case, pki, tmp_path),
        "get", "k",
    )  # fmt: skip
    assert f"connected to 127.0.0.1:{broker.port} (MQTT 5, TLS" in result.stderr, result.stderr
    assert result.returncode == 4 and "GET got no response within 1 s" in result.stderr
