"""No secret ever shows: the real commands are run, and everything they say is searched.

The password of the broker, the passphrase of the TLS client key and a service account token
are given the ways an operator gives them (systemd credential files, a password file, the
environment, a token file). Then `agent --print-config`, `agent --help`, `agent store` (working
and failing), an agent against a broker that requires the password and a client certificate
with the encrypted key, at DEBUG (connected and serving, then refused, then with the broker
gone) run for real, and every byte they write to stdout and stderr, and every message published
on the broker meanwhile (telemetry, state store traffic, the broker's own log topics), is
searched for each secret."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.support.mosquitto import mosquitto_binary
from tests.support.pki import KEY_PASSWORD, Pki, make_pki
from tests.support.processes import READY_URL, AgentProcess
from tests.support.secured_broker import SecuredMosquitto

USER = "edge-agent"
PASSWORD = "Br0ker-Pa55word-only-for-this-test"
WRONG_PASSWORD = "Wr0ng-Pa55word-also-secret"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.service-account-token-for-this-test.sig"
SECRETS = (PASSWORD, WRONG_PASSWORD, KEY_PASSWORD, TOKEN)
DEVICE = "thermostat-1"
ACTIVE = re.compile(r"started as active")

pytestmark = pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto is not installed")


def assert_no_secret(where: str, text: str | bytes) -> None:
    data = text.encode(errors="replace") if isinstance(text, str) else text
    for secret in SECRETS:
        assert secret.encode() not in data, f"{where} shows a secret"


class Everything:
    """A paho client that records every message published on the broker."""

    def __init__(self, port: int) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self._changed = threading.Condition()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"observer-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )  # fmt: skip
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.client.subscribe([("#", 0), ("$SYS/#", 0)])

    def _on_message(self, client: object, userdata: object, message: mqtt.MQTTMessage) -> None:
        with self._changed:
            self.messages.append(message)
            self._changed.notify_all()

    def wait_for_topic(self, topic: str, timeout: float = 20.0) -> None:
        with self._changed:
            found = self._changed.wait_for(
                lambda: any(m.topic == topic for m in self.messages), timeout
            )
        assert found, f"nothing published on {topic}"

    def everything(self) -> bytes:
        """Topics, payloads and every property of every message, as bytes."""
        with self._changed:
            return b"\n".join(
                m.topic.encode() + b" " + m.payload + b" " + str(m.properties).encode()
                for m in self.messages
            )

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def broker(pki: Pki) -> Iterator[SecuredMosquitto]:
    broker = SecuredMosquitto(
        pki, require_certificate=True, users={USER: PASSWORD}, plain_listener=True
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def credentials(directory: Path, password: str) -> Path:
    """Files as systemd's LoadCredential= provides them."""
    directory.mkdir(exist_ok=True)
    (directory / "mqtt-password").write_text(password + "\n")
    (directory / "mqtt-key-password").write_text(KEY_PASSWORD + "\n")
    return directory


def base_environment() -> dict[str, str]:
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("AGENT_") and name not in ("CREDENTIALS_DIRECTORY",)
    }


def run(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", *args],
        capture_output=True,
        text=True,
        env={**base_environment(), **env},
        timeout=timeout,
    )


def finish(process: AgentProcess, sig: int = signal.SIGTERM) -> str:
    """Stop the process (if running) and return all it wrote (stdout and stderr merged)."""
    if process.proc.poll() is None:
        process.signal(sig)
    process.proc.wait(30)
    assert process.proc.stdout is not None
    rest = process.proc.stdout.read().decode(errors="replace")
    process.stop()
    return "".join(process.lines) + process._partial.decode(errors="replace") + rest


def test_print_config_and_help(pki: Pki, tmp_path: Path) -> None:
    env = {
        "AGENT_DEVICE_ID": DEVICE,
        "AGENT_SERIAL__URL": "socket://127.0.0.1:9",
        "AGENT_MQTT__USERNAME": USER,
        "AGENT_MQTT__TLS__CERT_FILE": str(pki.client_cert),
        "AGENT_MQTT__TLS__KEY_FILE": str(pki.client_key_encrypted),
        "AGENT_MQTT__TLS__KEY_PASSWORD": KEY_PASSWORD,
        "CREDENTIALS_DIRECTORY": str(credentials(tmp_path / "credentials", PASSWORD)),
    }
    shown = run("--print-config", env=env)
    assert shown.returncode == 0, shown.stderr
    # Read, and shown only as where each comes from.
    config = json.loads(shown.stdout)
    assert config["mqtt"]["password"].startswith("set, from credential"), shown.stdout
    assert config["mqtt"]["tls"]["key_password"] == "set, from environment", shown.stdout
    helped = run("--help", env={**env, "AGENT_MQTT__PASSWORD": PASSWORD})
    assert helped.returncode == 0
    # A password without a user name: refused, and the refusal quotes no input.
    without_user = {name: value for name, value in env.items() if name != "AGENT_MQTT__USERNAME"}
    refused = run("--print-config", env=without_user)
    assert refused.returncode == 78 and "password is set but username is not" in refused.stderr
    for result in (shown, helped, refused):
        assert_no_secret(f"agent {result.args[3:]}", result.stdout + result.stderr)


def test_agent_store_with_a_password_file(
    broker: SecuredMosquitto, pki: Pki, tmp_path: Path
) -> None:
    service = AgentProcess(["emulator", "--external", broker.plain_url])
    try:
        service.wait_for(READY_URL)
        password_file, key_password_file = tmp_path / "password", tmp_path / "key-password"
        password_file.write_text(PASSWORD + "\n")
        key_password_file.write_text(KEY_PASSWORD + "\n")
        flags = [
            "--host", "127.0.0.1", "--port", str(broker.port), "--username", USER,
            "--password-file", str(password_file), "--ca-file", str(pki.ca),
            "--cert-file", str(pki.client_cert), "--key-file", str(pki.client_key_encrypted),
            "--key-password-file", str(key_password_file), "--log-level", "DEBUG",
        ]  # fmt: skip
        results = [run("store", *flags, "set", "secret-test", "v", env={})]
        assert results[0].returncode == 0, results[0].stderr
        results.append(run("store", *flags, "get", "secret-test", env={}))
        assert results[1].stdout == "v\n"
        password_file.write_text(WRONG_PASSWORD)
        results.append(run("store", *flags, "get", "secret-test", env={}))
        assert results[2].returncode == 4 and "refused the credentials" in results[2].stderr
        key_password_file.write_text(WRONG_PASSWORD)
        results.append(run("store", *flags, "get", "secret-test", env={}))
        assert results[3].returncode == 2 and "cannot use --cert-file" in results[3].stderr
        for result in results:
            assert "DEBUG" in result.stderr or result.returncode != 0
            assert_no_secret("agent store", result.stdout + result.stderr)
    finally:
        service.stop()


async def test_agent_store_with_a_token_file(tmp_path: Path) -> None:
    # A raw listener that accepts the CONNECT and answers nothing else: the request times out.
    received = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4096)
        received.set()
        writer.write(bytes([0x20, 0x03, 0x00, 0x00, 0x00]))
        await writer.drain()
        await reader.read(4096)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent", "store", "--host", "127.0.0.1", "--port", str(port),
            "--sat-file", str(token_file), "--timeout", "1", "--log-level", "DEBUG", "get", "k",
            env=base_environment(), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    finally:
        server.close()
    assert received.is_set() and process.returncode == 4
    assert_no_secret("agent store --sat-file", stdout + stderr)


def agent_flags(broker: SecuredMosquitto, pki: Pki, tmp_path: Path, device_url: str) -> list[str]:
    """Everything given as flags, except the secrets (credential files only)."""
    return [
        "--device-id", DEVICE, "--instance-id", "a", "--state-dir", str(tmp_path / "state"),
        "--serial-url", device_url, "--log-level", "DEBUG",
        "--mqtt-host", "127.0.0.1", "--mqtt-port", str(broker.port),
        "--mqtt-client-id", "secret-test-agent", "--mqtt-username", USER,
        "--mqtt-tls-ca-file", str(pki.ca), "--mqtt-tls-cert-file", str(pki.client_cert),
        "--mqtt-tls-key-file", str(pki.client_key_encrypted),
        "--mqtt-reconnect-min-s", "0.05", "--mqtt-reconnect-max-s", "0.2",
        "--telemetry-interval-s", "0.5", "--telemetry-jitter-s", "0",
    ]  # fmt: skip


def test_agent_at_debug_level(broker: SecuredMosquitto, pki: Pki, tmp_path: Path) -> None:
    observer = Everything(broker.plain_port or 0)
    service = AgentProcess(["emulator", "--external", broker.plain_url, "--log-level", "DEBUG"])
    device = AgentProcess(["sim-device", "--log-level", "DEBUG"], merge_stderr=True)
    outputs: dict[str, str] = {}
    try:
        service.wait_for(READY_URL)
        device_url = device.wait_for(re.compile(r"device (socket://\S+)")).group(1)
        flags = agent_flags(broker, pki, tmp_path, device_url)
        good = {"CREDENTIALS_DIRECTORY": str(credentials(tmp_path / "good", PASSWORD))}
        bad = {"CREDENTIALS_DIRECTORY": str(credentials(tmp_path / "bad", WRONG_PASSWORD))}

        # Connected and serving: active, publishing telemetry.
        agent = AgentProcess(flags, env={**base_environment(), **good}, merge_stderr=True)
        agent.wait_for(ACTIVE, timeout=30)
        observer.wait_for_topic(f"devices/{DEVICE}/telemetry")
        assert "connected to 127.0.0.1" in "".join(agent.lines)
        outputs["serving"] = finish(agent)

        # Refused: the wrong password is fatal.
        refused = AgentProcess(flags, env={**base_environment(), **bad}, merge_stderr=True)
        assert refused.proc.wait(30) == 78
        outputs["refused"] = finish(refused)
        assert "refused the credentials" in outputs["refused"]
        # Was: gmqtt's own lines about the CONNACK first, then the settings' own names.
        assert "check AGENT_MQTT__USERNAME, AGENT_MQTT__PASSWORD" in outputs["refused"]
        assert "gmqtt" not in outputs["refused"], outputs["refused"]

        # The broker gone: retried, and said so at every attempt.
        retrying = AgentProcess(flags, env={**base_environment(), **good}, merge_stderr=True)
        retrying.wait_for(ACTIVE, timeout=30)
        broker.stop()
        retrying.wait_for(re.compile("could not connect"), timeout=30)
        retrying.wait_for_new(re.compile("could not connect"), timeout=30)
        outputs["retrying"] = finish(retrying)
    finally:
        observer.close()
        outputs["state store service"] = finish(service)
        outputs["device"] = finish(device)
    assert "DEBUG" in outputs["serving"]  # the level asked for: everything is in there
    for name, output in outputs.items():
        assert_no_secret(f"the agent ({name})", output)
    published = observer.everything()
    assert f"devices/{DEVICE}/telemetry".encode() in published
    assert_no_secret("what was published on the broker", published)
