"""`agent store` as a user runs it: real processes against a running state store."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.mosquitto import Mosquitto
from tests.support.processes import READY_URL, AgentProcess


@pytest.fixture(scope="module")
def emulator() -> Iterator[dict[str, str]]:
    process = AgentProcess(["emulator", "--port", "0", "--deny-prefix", "secret/"])
    match = process.wait_for(READY_URL)
    yield {"AGENT_MQTT__HOST": match.group(1), "AGENT_MQTT__PORT": match.group(2)}
    process.stop()


def store(
    env: dict[str, str], *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "agent", "store", *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=30,
    )
    return result


def test_set_get_del(emulator: dict[str, str]) -> None:
    set_ = store(emulator, "set", "thermostat-1\\setPoint", "22.5")
    assert set_.returncode == 0, set_.stderr
    version = set_.stdout.strip()
    assert re.fullmatch(r"\d{15}:\d{5}:.+", version)
    got = store(emulator, "get", "thermostat-1\\setPoint", "--show-version")
    assert got.returncode == 0
    assert got.stdout == f"22.5\t{version}\n"
    assert store(emulator, "del", "thermostat-1\\setPoint").returncode == 0
    assert store(emulator, "del", "thermostat-1\\setPoint").returncode == 1
    absent = store(emulator, "get", "thermostat-1\\setPoint")
    assert (absent.returncode, absent.stdout) == (1, "")


def test_conditions_and_expiry(emulator: dict[str, str]) -> None:
    assert store(emulator, "set", "cli-nx", "a", "--nx").returncode == 0
    refused = store(emulator, "set", "cli-nx", "b", "--nx")
    assert refused.returncode == 1 and "not applied" in refused.stderr
    assert store(emulator, "set", "cli-nx", "b", "--nex").returncode == 1
    assert store(emulator, "set", "cli-nx", "a", "--nex", "--px", "60000").returncode == 0
    assert store(emulator, "vdel", "cli-nx", "b").returncode == 1
    assert store(emulator, "vdel", "cli-nx", "a").returncode == 0


def test_binary_values(emulator: dict[str, str]) -> None:
    assert store(emulator, "set", "cli-bin", "00ff0d0a", "--hex").returncode == 0
    assert store(emulator, "get", "cli-bin", "--hex").stdout == "00ff0d0a\n"
    assert store(emulator, "set", "cli-stdin", stdin=b"from stdin").returncode == 0
    assert store(emulator, "get", "cli-stdin").stdout == "from stdin\n"


# NUL, a byte that is not UTF-8, CR, LF, ESC, "[", a backslash: as every command prints it.
UNPRINTABLE, ESCAPED = "00ff0d0a1b5b5c", r"\x00\xff\r\n\x1b[\\"


def test_a_value_that_is_not_printable_text_is_escaped_the_same_way_everywhere(
    emulator: dict[str, str],
) -> None:
    """Was: a byte that is not UTF-8 escaped (\\xff), but NUL, CR, LF and ESC written to the
    terminal as they are; watch the same, its keys another way."""
    watcher = AgentProcess(["store", "watch", "cli-esc\tkey"], env=emulator)
    try:
        _wait_watching(watcher)
        assert store(emulator, "set", "cli-esc\tkey", UNPRINTABLE, "--hex").returncode == 0
        shown = watcher.wait_for(re.compile(r" SET (.*)$")).group(1)
        assert shown == "cli-esc\\tkey " + ESCAPED
    finally:
        watcher.stop()
    assert store(emulator, "get", "cli-esc\tkey").stdout == ESCAPED + "\n"
    raw = subprocess.run(
        [sys.executable, "-m", "agent", "store", "get", "cli-esc\tkey", "--raw"],
        capture_output=True,
        env={**os.environ, **emulator},
        timeout=30,
    )
    assert raw.stdout == bytes.fromhex(UNPRINTABLE)
    for text in ("C:\\temp\\x41", "21,5 °C"):  # printable text: as it is, backslashes too
        assert store(emulator, "set", "cli-text", text).returncode == 0
        assert store(emulator, "get", "cli-text").stdout == text + "\n"


def test_fencing_token(emulator: dict[str, str]) -> None:
    token = store(emulator, "set", "cli-lock", "me", "--nex", "--px", "60000").stdout.strip()
    assert store(emulator, "set", "cli-fenced", "1", "--fencing-token", token).returncode == 0
    unfenced = store(emulator, "set", "cli-fenced", "2")
    assert unfenced.returncode == 3
    assert unfenced.stderr.strip().endswith("a fencing token is required for this request")


def test_service_errors_exit_3(emulator: dict[str, str]) -> None:
    denied = store(emulator, "get", "secret/x")
    assert denied.returncode == 3 and "not authorized" in denied.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["set", "k", "v", "--px", "0"],
        ["set", "k", "zz", "--hex"],
        ["set", "k", "v", "--fencing-token", "nonsense"],
        ["set", "k", "v", "--nx", "--nex"],
        ["frobnicate"],
        ["get"],
    ],
)
def test_usage_errors_exit_2(emulator: dict[str, str], args: list[str]) -> None:
    assert store(emulator, *args).returncode == 2


def test_bad_settings_exit_2_naming_the_variable(emulator: dict[str, str]) -> None:
    result = store({**emulator, "AGENT_MQTT__PORT": "70000"}, "get", "k")
    assert result.returncode == 2
    assert "AGENT_MQTT__PORT" in result.stderr


@pytest.mark.parametrize(
    ("host", "port", "reason"),
    [
        ("127.0.0.1", "1", "connection refused: nothing accepts connections there"),
        ("no-such-host.invalid", "1883", "cannot resolve the host name"),
    ],
)
def test_connection_failure_exits_4_at_once(host: str, port: str, reason: str) -> None:
    # As redis-cli does: no retries for what retrying cannot fix, however long the timeout.
    env = {"AGENT_MQTT__HOST": host, "AGENT_MQTT__PORT": port}
    result = store(env, "get", "k", "--timeout", "600")
    assert result.returncode == 4
    assert result.stderr.startswith(f"agent store: cannot connect to {host}:{port}: {reason}")
    assert result.stderr.count("\n") == 1  # one line, no traceback, no log noise


def test_flags_override_the_environment(emulator: dict[str, str]) -> None:
    env = {"AGENT_MQTT__HOST": "127.0.0.1", "AGENT_MQTT__PORT": "1"}
    assert (
        store(env, "set", "cli-flag", "v", "--port", emulator["AGENT_MQTT__PORT"]).returncode == 0
    )


def test_password_never_shown_in_help() -> None:
    result = store({"AGENT_MQTT__PASSWORD": "hunter2"}, "--help")
    assert result.returncode == 0
    assert "hunter2" not in result.stdout and "--password-file" in result.stdout


def test_lock_acquire_hold_release(emulator: dict[str, str]) -> None:
    # A lease a loaded machine cannot lose between two renewals (a 600 ms one was lost
    # there: "lost: local lease deadline passed"); the renewals' timing is the lock's tests'.
    holder = AgentProcess(["store", "lock", "cli-lock-2", "--ttl-ms", "3000"], env=emulator)
    try:
        holder.wait_for(re.compile(r"acquired \d+"))
        # Held while its holder runs.
        other = store(emulator, "lock", "cli-lock-2", "--no-wait")
        assert other.returncode == 1 and "held by" in other.stderr
        holder.signal(signal.SIGINT)
        holder.wait_for(re.compile("released"))
        assert holder.proc.wait(10) == 0
    finally:
        holder.stop()
    assert store(emulator, "get", "cli-lock-2").returncode == 1


def test_watch_survives_a_broker_restart() -> None:
    broker = Mosquitto()
    broker.start()
    service = AgentProcess(["emulator", "--external", broker.url])
    env = {"AGENT_MQTT__HOST": broker.host, "AGENT_MQTT__PORT": str(broker.port)}
    watcher = None
    try:
        service.wait_for(READY_URL)
        watcher = AgentProcess(["store", "watch", "cli-watched"], env=env)
        assert store(env, "get", "cli-watched").returncode == 1  # the watcher is registering
        _wait_watching(watcher)
        assert store(env, "set", "cli-watched", "1").returncode == 0
        watcher.wait_for(re.compile(r"^\d{15}:\d{5}:\S+ SET cli-watched 1$"))
        broker.restart()
        _until_answered(env, "set", "cli-watched", "2")
        watcher.wait_for(re.compile(r"SET cli-watched 2$"), timeout=20)
        assert store(env, "del", "cli-watched").returncode == 0
        watcher.wait_for(re.compile(r"DELETE cli-watched$"), timeout=20)
        watcher.signal(signal.SIGINT)
        assert watcher.proc.wait(10) == 0
    finally:
        if watcher is not None:
            watcher.stop()
        service.stop()
        broker.stop()


def _until_answered(env: dict[str, str], *args: str) -> None:
    """Retries while the service is still reconnecting (its requests go unanswered)."""
    for _ in range(10):
        result = store(env, *args, "--timeout", "2")
        if result.returncode != 4:
            assert result.returncode == 0, result.stderr
            return
    raise AssertionError("the service never came back")


def _wait_watching(watcher: AgentProcess) -> None:
    """The watcher says so on stderr once its KEYNOTIFY is answered."""
    assert watcher.proc.stderr is not None
    line = watcher.proc.stderr.readline().decode()
    assert line.startswith("watching"), line
