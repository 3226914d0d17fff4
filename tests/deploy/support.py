"""Helpers of the deployment tests: tools, env files as systemd reads them, the settings."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from agent.config import ENV_NESTED_DELIMITER, ENV_PREFIX, AgentSettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNIT = ROOT / "systemd" / "agent@.service"
ENV_EXAMPLE = DEPLOY / "agent.env.example"
ANSIBLE = DEPLOY / "ansible"
EXEC_START = "/opt/agent/venv/bin/agent"
DEVICE = "thermostat-1"
LINE = "floor3"
"""The line of deploy/agent.env.example: 32 thermostats, floor3-t01@1 to floor3-t32@32."""

# Where the distribution keeps systemd's own units (sysinit.target and the like), which
# `systemd-analyze verify --root` needs beside the unit under test.
SYSTEMD_UNIT_DIRS = (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))


def missing(reason: str) -> NoReturn:
    """Skip for a missing tool on a developer's machine; in CI a missing tool is a failure."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (required in CI)")
    pytest.skip(reason)


def tool(name: str, hint: str) -> str:
    """The path of a command: next to this Python first (the test extra), then on PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        missing(f"{name} is not installed ({hint})")
    return found


def run(
    args: Sequence[str | os.PathLike[str]],
    *,
    check: bool = True,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(arg) for arg in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )
    if check and result.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, args))} exited {result.returncode}\n"
            f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        )
    return result


def debian_python() -> str:
    """The distribution's Python with venv, which the package and install.sh build on."""
    python = Path("/usr/bin/python3")
    if not python.exists():
        missing("/usr/bin/python3 is not installed (Debian: python3)")
    probe = subprocess.run(
        [str(python), "-c", "import ensurepip, venv, sys; sys.exit(sys.version_info < (3, 11))"],
        capture_output=True,
    )
    if probe.returncode != 0:
        missing("/usr/bin/python3 is older than 3.11 or lacks venv (Debian: python3-venv)")
    return str(python)


def add_systemd_units(root: Path) -> None:
    """Give a directory tree systemd's own units, so that `verify --root` can load ours, and
    the shell every Debian system has, which the unit's ExecReload= runs."""
    source = next((d for d in SYSTEMD_UNIT_DIRS if (d / "sysinit.target").exists()), None)
    if source is None:
        missing("systemd's units are not installed (Debian: systemd)")
    target = root / "usr" / "lib" / "systemd" / "system"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
    shell = root / "bin" / "sh"
    if not shell.exists():
        shell.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath("/bin/sh"), shell)


def verify_unit(root: Path, unit: str = f"agent@{LINE}.service") -> str:
    """What `systemd-analyze verify` says about a unit installed under root (empty: nothing)."""
    analyze = tool("systemd-analyze", "Debian: systemd")
    result = run([analyze, "verify", f"--root={root}", unit], check=False, timeout=60)
    return (result.stdout + result.stderr).strip()


# --------------------------------------------------------------------------- checkouts

STALE_VERSION = "0.0.1"


def checkout_copy(target: Path) -> Path:
    """A copy of the checkout's tracked parts, as an operator's checkout holds them."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, target / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("agent", "deploy", "systemd"):
        shutil.copytree(ROOT / name, target / name, ignore=ignore)
    return target


def add_stale_build_files(checkout: Path) -> None:
    """What an earlier `pip install -e .` and build of another version leave in a checkout."""
    info = checkout / "agent.egg-info"
    info.mkdir()
    (info / "PKG-INFO").write_text(
        f"Metadata-Version: 2.1\nName: agent\nVersion: {STALE_VERSION}\n"
    )
    (info / "top_level.txt").write_text("agent\n")
    stale = checkout / "build" / "lib" / "agent"
    stale.mkdir(parents=True)
    (stale / "removed_long_ago.py").write_text("")


def bump_version(checkout: Path) -> str:
    """Raises the last number of the project's version in a checkout; returns the new one."""
    pyproject = checkout / "pyproject.toml"
    text = pyproject.read_text()
    match = re.search(r'^version = "(.*?)(\d+)"$', text, re.M)
    assert match, "no version in pyproject.toml"
    new = f"{match.group(1)}{int(match.group(2)) + 1}"
    pyproject.write_text(text[: match.start()] + f'version = "{new}"' + text[match.end() :])
    return new


# --------------------------------------------------------------------------- env files

_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=")


def parse_env_file(text: str) -> dict[str, str]:
    """Assignments as systemd's EnvironmentFile= reads them (systemd.exec(5))."""
    values: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        # One logical line: skip blanks, comments and lines without "=".
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            break
        if text[i] in "#;":
            i = _end_of_line(text, i)
            continue
        match = _ASSIGNMENT.match(text, i)
        if match is None:
            i = _end_of_line(text, i)
            continue
        key = match.group(1)
        value, i = _parse_value(text, match.end())
        values[key] = value
    return values


def _end_of_line(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end + 1


def _parse_value(text: str, i: int) -> tuple[str, int]:
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    out: list[str] = []
    pending_space: list[str] = []  # interior whitespace is kept, trailing whitespace is not
    while i < n and text[i] != "\n":
        c = text[i]
        if c == "'" and not out and not pending_space:
            close = text.index("'", i + 1)
            out.append(text[i + 1 : close])
            i = close + 1
        elif c == '"' and not out and not pending_space:
            i += 1
            while text[i] != '"':
                if text[i] == "\\" and text[i + 1] == "\n":
                    i += 2
                elif text[i] == "\\" and text[i + 1] in '"\\`$':
                    out.append(text[i + 1])
                    i += 2
                else:
                    out.append(text[i])
                    i += 1
            i += 1
        elif c == "\\":
            if i + 1 < n and text[i + 1] == "\n":
                i += 2  # continuation
                continue
            out.extend(pending_space)
            pending_space = []
            if i + 1 < n:
                out.append(text[i + 1])
            i += 2
        elif c in " \t\r":
            pending_space.append(c)
            i += 1
        else:
            out.extend(pending_space)
            pending_space = []
            out.append(c)
            i += 1
    return "".join(out), i + 1


_COMMENTED = re.compile(r"^#\s?(AGENT_[A-Z0-9_]+=.*)$")


def commented_assignments(text: str) -> dict[str, str]:
    """The settings shown commented out (``#AGENT_X=value``), parsed as if they were not."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        match = _COMMENTED.match(line)
        if match:
            values.update(parse_env_file(match.group(1)))
    return values


# --------------------------------------------------------------------------- the settings


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            model = _model_of(arg)
            if model is not None:
                return model
    return None


def settings_fields(
    model: type[BaseModel] = AgentSettings, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, tuple[str, ...], FieldInfo]]:
    """Every leaf setting: (environment variable, path in the model, field)."""
    for name, field in model.model_fields.items():
        sub = _model_of(field.annotation)
        if sub is not None:
            yield from settings_fields(sub, (*path, name))
        else:
            variable = ENV_PREFIX + ENV_NESTED_DELIMITER.join((*path, name)).upper()
            yield variable, (*path, name), field


def has_plain_default(field: FieldInfo) -> bool:
    """A concrete default value (not required, not computed, not "unset")."""
    return (
        field.default is not PydanticUndefined
        and field.default is not None
        and field.default_factory is None
    )


def value_at(settings: BaseModel, path: tuple[str, ...]) -> Any:
    node: Any = settings
    for part in path:
        node = getattr(node, part)
    return node


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> AgentSettings:
    """AgentSettings read from exactly these variables (nothing else of the environment)."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX) or name in ("CREDENTIALS_DIRECTORY", "STATE_DIRECTORY"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return AgentSettings()  # type: ignore[call-arg]


def script_env() -> dict[str, str]:
    """The environment for the deployment scripts, without this virtual environment in it."""
    here = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != here
    )
    return env
