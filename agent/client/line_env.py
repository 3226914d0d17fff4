"""Which env file a command reads its settings from, and where the broker it tried came from.

On a gateway the broker's address and the keys are in the line's env file,
``/etc/agent/<line>.env`` (the unit's ``EnvironmentFile=``): a command reads it as the agent
does, under the environment and the flags, so that ``agent status floor3`` finds the broker
the line's agents use. ``--env-file`` names another (``/dev/null``: none).
"""

from __future__ import annotations

import os
from pathlib import Path

from dotenv import dotenv_values

from agent.config import check_id, env_file_problem

LINE_ENV_DIR = Path("/etc/agent")
"""Where a gateway keeps each line's env file, ``<line>.env``."""


def line_env_file(given: Path | None, name: str | None) -> Path | None:
    """The env file a command reads: ``given`` (--env-file), else on a gateway the one of the
    line ``name`` names, else the only line's there is; None when there is none."""
    if given is not None:
        return given
    try:
        if name is not None and _usable(name):
            candidate = LINE_ENV_DIR / f"{name}.env"
            if candidate.is_file():
                return candidate
        found = sorted(p for p in LINE_ENV_DIR.glob("*.env") if p.is_file())
    except OSError:
        return None
    return found[0] if len(found) == 1 else None


def readable(path: Path | None) -> Path | None:
    """The env file, when it can be read as settings (the line's is root's alone, 0600)."""
    return path if path is not None and env_file_problem(path) is None else None


def _usable(name: str) -> bool:
    try:
        check_id(name)
    except ValueError:
        return False
    return True


def broker_source(given: dict[str, bool], env_file: Path | None) -> str:
    """Where the host and port tried came from, and how to set them, for a failed connect:
    ``given`` says which of ``host`` and ``port`` a flag set."""
    variables = {"host": "AGENT_MQTT__HOST", "port": "AGENT_MQTT__PORT"}
    environment = {name.upper() for name in os.environ}
    problem = None if env_file is None else env_file_problem(env_file)
    in_file = (
        {name.upper() for name in dotenv_values(env_file) if name}
        if env_file is not None and problem is None
        else set()
    )
    sources: dict[str, str] = {}
    for what, variable in variables.items():
        if given.get(what):
            sources[what] = f"from --{what}"
        elif variable in environment:
            sources[what] = f"from {variable}"
        elif variable in in_file:
            sources[what] = f"from {env_file}"
        else:
            sources[what] = "the default"
    host, port = sources["host"], sources["port"]
    if host == port:
        said = "the defaults" if host == "the default" else host
        said = f"The host and port are {said}"
    else:
        said = f"The host is {host}, the port {port}"
    if problem is not None:
        said += f" ({env_file} not read: {problem}; run as root?)"
    return (
        f"{said}: set them with --host and --port, AGENT_MQTT__HOST and AGENT_MQTT__PORT, or "
        f"--env-file (on a gateway, {LINE_ENV_DIR}/<line>.env is read when it exists)."
    )
