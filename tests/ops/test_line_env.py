"""On a gateway the operator commands read the line's env file, /etc/agent/<line>.env, as
the agent does (or the one --env-file names), and a broker they cannot reach is said with the
host and port tried, where they came from and how to set them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.client import line_env
from agent.client.line_env import line_env_file
from tests.ops.support import report
from tests.support.ports import free_port
from tests.support.rig import LineRig

LINE = LineRig.LINE
EXIT_CONNECTION = 4
# A command run as a process, with the gateway's directory of env files somewhere else.
ON_A_GATEWAY = (
    "import sys; from pathlib import Path; import agent.client.line_env as e; "
    "e.LINE_ENV_DIR = Path(sys.argv[1]); import agent.cli; sys.exit(agent.cli.main(sys.argv[2:]))"
)


def env_file(folder: Path, line: str, port: int) -> Path:
    """A line's env file as the package's example makes it: the broker and everything else."""
    folder.mkdir(exist_ok=True)
    path = folder / f"{line}.env"
    path.write_text(
        f"AGENT_LINE_ID={line}\nAGENT_DEVICES={line}-t01@1\nAGENT_SERIAL__URL=/dev/agent/{line}\n"
        f"AGENT_MQTT__HOST=127.0.0.1\nAGENT_MQTT__PORT={port}\n"
    )
    path.chmod(0o600)
    return path


def agent(
    *args: str, gateway: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`agent ARGS` with no connection flag and nothing of this environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    where = ["-c", ON_A_GATEWAY, str(gateway)] if gateway is not None else ["-m", "agent"]
    return subprocess.run(
        [sys.executable, *where, *args, "--timeout", "5"],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=30,
        check=False,
    )


def test_status_on_a_gateway_finds_the_broker_in_the_lines_env_file(
    line: LineRig, tmp_path: Path
) -> None:
    report(line, LINE, "a", line.device_ids)
    gateway = tmp_path / "etc-agent"
    env_file(gateway, LINE, line.port)
    shown = agent("status", LINE, "--json", gateway=gateway)
    assert shown.returncode != EXIT_CONNECTION, shown.stderr
    assert [entry["line"] for entry in json.loads(shown.stdout)["lines"]] == [LINE]
    # One line on the gateway: its file serves a device's name too.
    assert agent("status", "t02", "--json", gateway=gateway).returncode != EXIT_CONNECTION


def test_env_file_flag_under_the_environment(line: LineRig, tmp_path: Path) -> None:
    report(line, LINE, "a", line.device_ids)
    named = env_file(tmp_path, LINE, line.port)
    assert agent("status", LINE, "--json", "--env-file", str(named)).returncode != EXIT_CONNECTION
    # The environment wins over the file, as for the agent.
    closed = env_file(tmp_path / "other", LINE, free_port())
    moved = agent(
        "status",
        LINE,
        "--json",
        "--env-file",
        str(closed),
        env={"AGENT_MQTT__PORT": str(line.port)},
    )
    assert moved.returncode != EXIT_CONNECTION, moved.stderr


def test_a_broker_not_reached_is_said_with_what_was_tried_and_how_to_set_it(
    tmp_path: Path,
) -> None:
    port = free_port()
    named = env_file(tmp_path, LINE, port)
    failed = agent("status", LINE, "--env-file", str(named))
    assert failed.returncode == EXIT_CONNECTION
    (said,) = failed.stderr.splitlines()
    assert said.startswith(f"agent status: cannot connect to 127.0.0.1:{port}: connection refused")
    assert f"The host and port are from {named}: set them with --host and --port," in said
    assert "AGENT_MQTT__HOST and AGENT_MQTT__PORT, or --env-file" in said

    bare = agent("setpoint", "get", "t01", "--port", str(port), gateway=tmp_path / "none")
    assert bare.returncode == EXIT_CONNECTION
    assert f"cannot connect to localhost:{port}" in bare.stderr
    assert "The host is the default, the port from --port: set them" in bare.stderr

    missing = agent("status", LINE, "--env-file", str(tmp_path / "floor9.env"))
    assert missing.returncode == 2
    assert missing.stderr == f"agent status: --env-file {tmp_path / 'floor9.env'}: no such file\n"


def test_which_env_file_a_command_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(line_env, "LINE_ENV_DIR", tmp_path)
    assert line_env_file(None, "floor3") is None  # no env file: the environment alone
    three = env_file(tmp_path, "floor3", 1)
    assert line_env_file(None, "floor3") == three
    assert line_env_file(None, "floor3-t07") == three  # the only line's
    assert line_env_file(None, None) == three
    four = env_file(tmp_path, "floor4", 1)
    assert line_env_file(None, "floor4") == four
    assert line_env_file(None, "floor3-t07") is None  # which one: not guessed
    assert line_env_file(None, "../floor3") is None  # never a path
    assert line_env_file(Path("/dev/null"), "floor3") == Path("/dev/null")
