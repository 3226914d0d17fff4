"""`agent`: run the agent. Every setting is an environment variable (AGENT_...) and a flag."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from agent import logs
from agent.config import (
    CREDENTIAL_FILES,
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    AgentSettings,
    as_running,
    env_file_problem,
    known_variables,
    redacted,
    setting_errors,
    unknown_variables,
)
from agent.config.fingerprint import config_hash
from agent.runtime.exits import EXIT_CONFIG
from agent.runtime.handover import Handover, become, write_handover
from agent.runtime.version import installed

SIMULATED_DEVICE = "thermostat-1"
SIMULATED_LINE = "floor-1"
SIMULATED_PROFILE = "sim"
MAX_SIMULATED_UNITS = 247  # the addresses of a line
EXIT_USAGE = 2  # as argparse exits for a flag it cannot parse
# Where systemd looks up LoadCredential=NAME:agent.<device>.NAME (a name, not a path).
CREDENTIAL_STORES = (Path("/etc/credstore"), Path("/run/credstore"), Path("/usr/lib/credstore"))

log = logging.getLogger("agent")


def _is_secret(field: FieldInfo) -> bool:
    return SecretStr in getattr(field.annotation, "__args__", ()) or field.annotation is SecretStr


def _settings_fields(
    model: type[BaseModel], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], FieldInfo]]:
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _settings_fields(annotation, (*path, name))
        elif not _is_secret(field):  # secrets only from the environment or credentials
            yield (*path, name), field


def _default_text(field: FieldInfo) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    if field.default_factory is not None:
        return "computed"
    return "none" if field.default in (None, "") else str(field.default)


def build_parser(subcommands: Sequence[str] = ()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent",
        description="Keeps a controller's set point in sync with the Azure IoT Operations "
        "state store, as one instance of an active/standby pair. Every setting below is "
        "also an environment variable (shown in brackets); flags win over the environment, "
        "which wins over --env-file. Secrets (AGENT_MQTT__PASSWORD, "
        "AGENT_MQTT__TLS__KEY_PASSWORD) come only from the environment or from the "
        "credential files mqtt-password and mqtt-key-password in $CREDENTIALS_DIRECTORY.",
        epilog="other commands: "
        + ", ".join(f"agent {name}" for name in subcommands)
        + " (see agent COMMAND --help)",
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="run with a fake controller and, unless a broker is configured, an embedded "
        "state store: everything on this machine",
    )
    parser.add_argument("--pair", action="store_true", help="with --simulate: add a standby")
    parser.add_argument(
        "--status",
        action="store_true",
        help="with --simulate: show the line's status (agent status --watch) redrawn in "
        "place, with the latest log lines, instead of the log",
    )
    parser.add_argument(
        "--units",
        type=int,
        metavar="N",
        help="with --simulate: a whole line of N thermostats (addresses 1..N, N from 1 to "
        f"{MAX_SIMULATED_UNITS}) instead of one",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective settings and exit"
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"agent {installed()} (Python {platform.python_version()})",
    )
    parser.add_argument("--env-file", type=Path, help="read settings from this env file too")
    # A reload's check of the files (agent.runtime.handover): the settings on stdout.
    parser.add_argument("--hand-over", action="store_true", help=argparse.SUPPRESS)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for path, field in _settings_fields(AgentSettings):
        section = path[0] if len(path) > 1 else "agent"
        if section not in groups:
            groups[section] = parser.add_argument_group(f"{section} settings")
        variable = "AGENT_" + "__".join(path).upper()
        description = (field.description or "").rstrip(".")
        help_text = f"{description} [{variable}; default: {_default_text(field)}]".lstrip()
        groups[section].add_argument(
            "--" + "-".join(path).replace("_", "-"),
            dest="setting:" + ".".join(path),
            metavar="VALUE",
            default=argparse.SUPPRESS,
            help=help_text.replace("%", "%%"),
        )
    return parser


def _flag_settings(args: argparse.Namespace) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if not dest.startswith("setting:"):
            continue
        *parents, leaf = dest.removeprefix("setting:").split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def _configured(name: str, flags: dict[str, Any], *path: str) -> bool:
    """Whether the user gave this setting (flag or environment)."""
    node: Any = flags
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node is not None or name in os.environ


def load_settings(args: argparse.Namespace) -> AgentSettings:
    given = list(os.environ)
    if args.env_file is not None:
        given += [name for name in dotenv_values(args.env_file) if name]
    unknown = unknown_variables(given, known_variables(AgentSettings))
    if unknown:
        raise ConfigError("\n".join(unknown))
    flags = _flag_settings(args)
    if args.simulate:
        # Sensible defaults for a laptop; anything configured still wins.
        line_given = any(
            _configured(name, flags, field)
            for name, field in (
                ("AGENT_DEVICE_ID", "device_id"),
                ("AGENT_DEVICES", "devices"),
                ("AGENT_DEVICES_FILE", "devices_file"),
                ("AGENT_LINE_ID", "line_id"),
            )
        )
        # The simulated units are whole thermostats: their devices name the built-in
        # profile `sim`, so that every point is kept both ways (a device that names a
        # profile is one listed in AGENT_DEVICES; one alone on a line of its own name is
        # the single device AGENT_DEVICE_ID would make).
        if not line_given and args.units:
            flags["line_id"] = SIMULATED_LINE
            flags["devices"] = [
                {"id": f"{SIMULATED_LINE}-t{n:02d}", "address": n, "profile": SIMULATED_PROFILE}
                for n in range(1, args.units + 1)
            ]
        elif not line_given:
            flags["line_id"] = SIMULATED_DEVICE
            flags["devices"] = [{"id": SIMULATED_DEVICE, "profile": SIMULATED_PROFILE}]
        if not _configured("AGENT_INSTANCE_ID", flags, "instance_id"):
            flags["instance_id"] = "a"
        if not _configured("AGENT_STATE_DIR", flags, "state_dir") and not os.environ.get(
            "STATE_DIRECTORY"
        ):
            flags["state_dir"] = tempfile.mkdtemp(prefix="agent-simulate-")
    settings = AgentSettings(  # type: ignore[call-arg]
        _env_file=args.env_file, _env_file_encoding="utf-8", **flags
    )
    if not args.simulate and not settings.serial.url:
        raise ConfigError(
            "AGENT_SERIAL__URL (serial.url): required: a device path such as "
            "/dev/serial/by-id/..., or socket://HOST:PORT"
        )
    return settings


class ConfigError(Exception):
    """Settings the agent refuses: one line per setting."""


def main(argv: Sequence[str], subcommands: Sequence[str] = ()) -> int:
    parser = build_parser(subcommands)
    args = parser.parse_args(argv)
    # One line each, not argparse's usage: the usage of every setting flag hides the reason.
    simulation_only = [
        flag
        for flag, given in (
            ("--pair", args.pair),
            ("--units", args.units is not None),
            ("--status", args.status),
        )
        if given
    ]
    if simulation_only and not args.simulate:
        logs.console_error(
            f"agent: {' and '.join(simulation_only)}: only with --simulate (add --simulate)"
        )
        return EXIT_USAGE
    if args.units is not None and not 1 <= args.units <= MAX_SIMULATED_UNITS:
        logs.console_error(
            f"agent: --units {args.units}: a line has 1 to {MAX_SIMULATED_UNITS} thermostats "
            "(leave --units out for one)"
        )
        return EXIT_USAGE
    if args.env_file is not None:
        problem = env_file_problem(args.env_file)
        if problem is not None:
            logs.console_error(f"agent: --env-file {args.env_file}: {problem}")
            return EXIT_CONFIG
    if args.hand_over:
        found = _reload_settings(args)
        if isinstance(found, str):
            logs.console_error(found)
            return EXIT_CONFIG
        return write_handover(Handover(as_running(found), tuple(argv), installed()))
    try:
        settings = load_settings(args)
        if args.print_config:
            return _print_config(args, settings)
    except ValidationError as exc:
        for line in setting_errors(exc):
            logs.console_error(f"agent: invalid setting {line}")
        return EXIT_CONFIG
    except ConfigError as exc:
        for line in str(exc).splitlines():
            logs.console_error(f"agent: invalid setting {line}")
        return EXIT_CONFIG
    logs.setup(settings.log_level)
    if args.simulate:
        from agent.runtime.simulate import simulate

        broker_configured = _configured("AGENT_MQTT__HOST", _flag_settings(args), "mqtt", "host")
        return asyncio.run(
            simulate(settings, pair=args.pair, use_broker=broker_configured, status=args.status)
        )
    become(Handover(as_running(settings), tuple(argv), installed()))


def _print_config(args: argparse.Namespace, settings: AgentSettings) -> int:
    """The effective settings as JSON; a secret shows where it comes from, never its value.

    Run by hand (not under systemd), the credentials the unit would load for this device
    (``/etc/credstore/agent.<device>.mqtt-password``, ...) are read as the service reads
    them, so that the check sees what the service will see.
    """
    stored: dict[str, Path] = {}
    if not os.environ.get("CREDENTIALS_DIRECTORY"):
        stored = _stored_credentials(settings.line.id)
    with _credentials_directory(stored) as reloaded:
        if reloaded:
            settings = load_settings(args)
        shown = redacted(settings)
        for name, path in CREDENTIAL_FILES.items():
            node = shown
            for part in path[:-1]:
                node = node[part]
            if node[path[-1]] is not None:
                node[path[-1]] = _secret_source(path, args.env_file, stored.get(name))
    shown["derived"] = {
        "line_id": settings.line.id,
        "client_id": settings.client_id,
        "lock_key": settings.lock_key,
        "line_telemetry_topic": settings.telemetry_line_topic,
        # What the instance's health and `agent status` show once it runs these files: after
        # a reload, the same hash says the change took.
        "config_hash": config_hash(settings),
        "devices": {
            device.id: {
                "address": device.address,
                "setpoint_key": settings.key("setpoint", device.id),
                "synced_key": settings.key("synced", device.id),
                "line_key": settings.key("line", device.id),
                "telemetry_topic": settings.telemetry_topic(device.id),
            }
            for device in settings.line.devices
        },
    }
    print(json.dumps(shown, indent=2))
    return 0


def _stored_credentials(instance: str) -> dict[str, Path]:
    """The credential files systemd would load for this unit instance (the line), by
    credential name."""
    found: dict[str, Path] = {}
    for name in CREDENTIAL_FILES:
        for store in CREDENTIAL_STORES:
            candidate = store / f"agent.{instance}.{name}"
            try:
                if candidate.is_file():
                    found[name] = candidate
                    break
            except PermissionError:
                print(
                    f"agent: {store} is not readable: credentials not checked (run as root)",
                    file=sys.stderr,
                )
                return {}
    return found


@contextlib.contextmanager
def _credentials_directory(files: dict[str, Path]) -> Iterator[bool]:
    """$CREDENTIALS_DIRECTORY pointing at these files for the time of the block."""
    if not files:
        yield False
        return
    with tempfile.TemporaryDirectory(prefix="agent-credentials-") as directory:
        for name, source in files.items():
            (Path(directory) / name).symlink_to(source)
        os.environ["CREDENTIALS_DIRECTORY"] = directory
        try:
            yield True
        finally:
            del os.environ["CREDENTIALS_DIRECTORY"]


def _secret_source(path: tuple[str, ...], env_file: Path | None, stored: Path | None) -> str:
    """Where a secret that is set comes from, in the order the settings are read."""
    variable = ENV_PREFIX + ENV_NESTED_DELIMITER.join(path).upper()
    if any(name.upper() == variable for name in os.environ):
        return "set, from environment"
    if env_file is not None and any(name.upper() == variable for name in dotenv_values(env_file)):
        return f"set, from env file {env_file}"
    return "set, from credential" + (f" {stored}" if stored is not None else "")


def _reload_settings(args: argparse.Namespace) -> AgentSettings | str:
    """The settings read again for a reload, or why they cannot be (one line)."""
    try:
        return load_settings(args)
    except ValidationError as exc:
        return "invalid setting " + "; ".join(setting_errors(exc))
    except ConfigError as exc:
        return "invalid setting " + "; ".join(str(exc).splitlines())
