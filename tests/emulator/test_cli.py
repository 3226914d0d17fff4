"""`agent emulator` flags, as a real process: security, limits, the data directory."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.emulator.certs import Authority
from tests.emulator.conftest import RawClient
from tests.support.paho_client import PahoStoreClient
from tests.support.ports import free_port
from tests.support.processes import AgentProcess

READY = re.compile(r"ready at (mqtts?)://([^:\s]+):(\d+)")
PASSWORD = "pa55-word-never-logged"


def run_emulator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "emulator", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def started(*args: str) -> tuple[AgentProcess, int]:
    process = AgentProcess(["emulator", "--port", "0", *args], merge_stderr=True)
    match = process.wait_for(READY)
    return process, int(match.group(3))


def test_help_documents_the_security_flags_and_file_formats() -> None:
    out = run_emulator("--help").stdout
    for flag in ("--authz", "--users", "--sat-tokens", "--tls-cert", "--tls-key", "--client-ca"):
        assert flag in out
    assert "stateStoreResources" in out and "certificateSubjects" in out
    assert "--max-packet-size" in out and "--data-dir" in out


@pytest.mark.parametrize(
    ("files", "args", "names"),
    [
        ({"rules.json": "{"}, ["--authz", "rules.json"], "--authz"),
        (
            {"rules.json": json.dumps({"rules": [{"principals": {}}]})},
            ["--authz", "rules.json"],
            "rules[0].principals",
        ),
        ({}, ["--authz", "missing.json"], "--authz"),
        ({"users.json": json.dumps({"alice": ""})}, ["--users", "users.json"], "--users"),
        ({"tokens": "\n"}, ["--sat-tokens", "tokens"], "--sat-tokens"),
        ({"cert.pem": "x"}, ["--tls-cert", "cert.pem"], "--tls-cert and --tls-key go together"),
        ({"a.pem": "x", "b.pem": "y"}, ["--tls-cert", "a.pem", "--tls-key", "b.pem"], "a.pem"),
        ({}, ["--max-packet-size", "10"], "--max-packet-size"),
        ({}, ["--max-registrations", "0"], "--max-registrations must be at least 1"),
        ({}, ["--external", "mqtt://127.0.0.1:1", "--authz", "r.json"], "--authz"),
    ],
)
def test_settings_that_make_no_sense_exit_78_naming_the_flag(
    tmp_path: Path, files: dict[str, str], args: list[str], names: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    resolved = [
        str(tmp_path / a) if (tmp_path / a).exists() or a.endswith(".json") else a for a in args
    ]
    result = run_emulator(*resolved)
    assert result.returncode == 78, result
    assert names in result.stderr
    assert "Traceback" not in result.stderr


def test_a_users_file_error_does_not_show_the_passwords(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    users.write_text('{"alice": "' + PASSWORD + '", "bob": 5}')
    result = run_emulator("--users", str(users))
    assert result.returncode == 78
    assert PASSWORD not in result.stderr + result.stdout


def test_mutual_tls_users_and_rules_through_the_command(tmp_path: Path) -> None:
    ca = Authority(tmp_path)
    server = ca.issue("localhost", server=True)
    client_cert = ca.issue("gw1")
    (tmp_path / "users.json").write_text(json.dumps({"operator": PASSWORD}))
    (tmp_path / "rules.json").write_text(
        json.dumps(
            {
                "rules": [
                    {
                        "principals": {"usernames": ["operator"]},
                        "brokerResources": [
                            {"method": "Connect"},
                            {"method": "Subscribe", "topics": ["clients/{principal.clientId}/#"]},
                        ],
                        "stateStoreResources": [
                            {"keyType": "Pattern", "keys": ["line1/*"], "method": "ReadWrite"}
                        ],
                    }
                ]
            }
        )
    )
    process, port = started(
        "--tls-cert", str(server.cert), "--tls-key", str(server.key),
        "--client-ca", str(ca.cert_file),
        "--users", str(tmp_path / "users.json"), "--authz", str(tmp_path / "rules.json"),
        "--log-level", "DEBUG",
    )  # fmt: skip
    try:
        assert process.wait_for(READY).group(1) == "mqtts"

        def configure(client: object) -> None:
            import ssl

            context = ssl.create_default_context(cafile=str(ca.cert_file))
            context.load_cert_chain(client_cert.cert, client_cert.key)
            client.tls_set_context(context)  # type: ignore[attr-defined]
            client.username_pw_set("operator", PASSWORD)  # type: ignore[attr-defined]

        client = PahoStoreClient("127.0.0.1", port, "op", configure=configure)
        try:
            assert client.request("SET", "line1/a", "1").payload == b"+OK\r\n"
            assert client.request("SET", "line2/a", "1").payload == b"-ERR not authorized\r\n"
        finally:
            client.close()
        process.drain()
    finally:
        assert process.stop() == 0
    output = "".join(process.lines)
    assert "client op connected" in output  # the log was read, at DEBUG
    assert PASSWORD not in output


def test_limits_from_the_command_line_are_advertised() -> None:
    process, port = started("--max-packet-size", "2048")
    try:
        raw = RawClient(port)
        assert raw.connect("c").properties.maximum_packet_size == 2048
        raw.close()
    finally:
        assert process.stop() == 0


def test_the_data_directory_keeps_the_store_across_restarts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for round_ in range(2):
        process, port = started("--data-dir", str(data))
        try:
            client = PahoStoreClient("127.0.0.1", port, f"c{round_}")
            try:
                if round_ == 0:
                    assert client.request("SET", "kept", "42").payload == b"+OK\r\n"
                    assert client.request("SET", "brief", "x", "PX", "100").payload == b"+OK\r\n"
                else:
                    assert client.request("GET", "kept").payload == b"$2\r\n42\r\n"
                    assert client.request("GET", "brief").payload == b"$-1\r\n"
            finally:
                client.close()
        finally:
            assert process.stop() == 0
    assert (data / "store.log").exists()


def test_an_unusable_data_directory_exits_78(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_emulator("--data-dir", str(blocker / "sub"))
    assert result.returncode == 78
    assert "--data-dir" in result.stderr


def _rules_naming(tmp_path: Path) -> Path:
    rules = tmp_path / "rules.json"
    rules.write_text(
        json.dumps(
            {
                "rules": [
                    {
                        "principals": {"usernames": ["operator"]},
                        "brokerResources": [{"method": "Connect"}],
                    }
                ]
            }
        )
    )
    return rules


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ([], "nothing verifies user names"),
        (["--sat-tokens", "tokens"], "no client can prove a user name"),
        (["--users", "users.json"], None),
    ],
)
def test_rules_that_name_users_nothing_verifies_are_warned_of_at_start(
    tmp_path: Path, flags: list[str], says: str | None
) -> None:
    (tmp_path / "tokens").write_text("t\n")
    (tmp_path / "users.json").write_text(json.dumps({"operator": PASSWORD}))
    resolved = [str(tmp_path / f) if not f.startswith("--") else f for f in flags]
    process, _ = started("--authz", str(_rules_naming(tmp_path)), *resolved)
    try:
        process.drain()
    finally:
        assert process.stop() == 0
    output = "".join(process.lines)
    if says is None:
        assert "user names" not in output
    else:
        assert says in output and "operator" in output


def test_a_second_emulator_on_a_data_directory_in_use_refuses_to_start(tmp_path: Path) -> None:
    """Was: both started, and the keys of one were lost."""
    data = tmp_path / "data"
    first, port = started("--data-dir", str(data))
    try:
        client = PahoStoreClient("127.0.0.1", port, "c")
        try:
            assert client.request("SET", "kept", "1").payload == b"+OK\r\n"
        finally:
            client.close()
        second = run_emulator("--data-dir", str(data))
        assert second.returncode == 78, second
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and str(data) in lines[0], second.stderr
        assert f"pid {first.proc.pid}" in lines[0], second.stderr
    finally:
        assert first.stop() == 0
    again, port = started("--data-dir", str(data))  # free again once the first stopped
    try:
        client = PahoStoreClient("127.0.0.1", port, "c")
        try:
            assert client.request("GET", "kept").payload == b"$1\r\n1\r\n"
        finally:
            client.close()
    finally:
        assert again.stop() == 0


# ---------------------------------------------------------------------------- clear errors


def _listening() -> socket.socket:
    """A port that accepts TCP connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def _one_line_error(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert result.returncode not in (0, None), result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for part in parts:
        assert part in lines[0], result.stderr


def test_a_port_in_use_is_said_in_one_line() -> None:
    """Was: a traceback."""
    with _listening() as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "agent", "emulator", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    _one_line_error(result, f"cannot listen on 127.0.0.1:{port}", "in use")


def test_an_external_broker_that_cannot_be_reached_is_said_in_one_line() -> None:
    """Was: 30 s of retries, then a SessionTimeout traceback."""
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "agent", "emulator", "--external", f"mqtt://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    _one_line_error(result, f"cannot reach the broker at mqtt://127.0.0.1:{port}")


def test_ctrl_c_is_honoured_while_waiting_for_an_external_broker() -> None:
    """Was: ignored for 30 s, while it waited for a broker that does not answer."""
    with _listening() as silent:
        url = f"mqtt://127.0.0.1:{silent.getsockname()[1]}"
        process = subprocess.Popen(
            [sys.executable, "-m", "agent", "emulator", "--external", url, "--log-level", "ERROR"],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            conn, _ = silent.accept()  # it is connecting, and waits for a CONNACK
            conn.close()
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=3)
        finally:
            process.kill()
            process.wait()
    assert process.returncode not in (0, None)
    assert "Traceback" not in stderr, stderr


def test_plain_mqtt_on_a_tls_port_is_named_on_both_sides(tmp_path: Path) -> None:
    """Was: the server logged a TLS error, and `agent store` waited its whole 10 s and
    blamed the broker ("closed the connection before CONNACK (a TLS port? ...)")."""
    ca = Authority(tmp_path)
    server = ca.issue("localhost", server=True)
    process, port = started(
        "--tls-cert", str(server.cert), "--tls-key", str(server.key)
    )  # fmt: skip
    try:
        # A wait of a minute, so that one waited out is never mistaken for an answer at once
        # on a loaded machine (a Python process's start alone took seconds there).
        began = time.monotonic()
        client = _store("--port", str(port), "--timeout", "60", "get", "k")
        assert time.monotonic() - began < 20, "not said at once"
        assert client.returncode == 4, client
        assert client.stderr == (
            f"agent store: cannot connect to 127.0.0.1:{port}: the port speaks TLS, and this "
            "client connected without it: set --tls (and --ca-file for a CA of your own)\n"
        )
        process.wait_for(re.compile("plain MQTT"), timeout=5)
    finally:
        assert process.stop() == 0


def test_an_external_broker_on_a_tls_port_is_said_in_one_line(tmp_path: Path) -> None:
    """Was: 30 s of retries, then "a TLS port? see mqtt.tls.enabled": a setting --external
    does not have."""
    ca = Authority(tmp_path)
    server = ca.issue("localhost", server=True)
    broker, port = started("--tls-cert", str(server.cert), "--tls-key", str(server.key))
    try:
        url = f"mqtt://127.0.0.1:{port}"
        result = subprocess.run(
            [sys.executable, "-m", "agent", "emulator", "--external", url],
            capture_output=True,
            text=True,
            timeout=10,
        )
    finally:
        assert broker.stop() == 0
    _one_line_error(result, f"cannot use the broker at {url}: that port speaks TLS")
    assert result.stderr.rstrip().endswith("give it the broker's plain MQTT port")


def test_tls_on_a_plain_port_is_named(tmp_path: Path) -> None:
    ca = Authority(tmp_path)
    tls = ["--tls", "--ca-file", str(ca.cert_file), "--timeout", "2"]
    process, port = started()
    try:  # our broker answers the ClientHello with a CONNACK: garbage to TLS
        client = _store("--port", str(port), *tls, "get", "k")
        assert "without TLS?" in client.stderr, client.stderr
    finally:
        assert process.stop() == 0
    with _listening() as silent:  # a broker that waits for more: the handshake times out
        client = _store("--port", str(silent.getsockname()[1]), *tls, "get", "k")
    assert client.returncode == 4, client
    assert "TLS handshake" in client.stderr and "without TLS?" in client.stderr, client.stderr


def _store(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "store", "--host", "127.0.0.1", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
