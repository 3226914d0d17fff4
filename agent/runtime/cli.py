"""`agent`: run the agent. Every setting is an environment variable (AGENT_...) and a flag."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from agent import logs
from agent.config import AgentSettings, redacted, setting_errors
from agent.runtime.agent import EXIT_CONFIG, Agent
from agent.runtime.notify import Notifier

SIMULATED_DEVICE = "thermostat-1"
SIMULATED_LINE = "floor-1"


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
        "--units",
        type=int,
        default=0,
        metavar="N",
        help="with --simulate: a whole line of N thermostats (addresses 1..N) instead of one",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective settings and exit"
    )
    parser.add_argument("--env-file", type=Path, help="read settings from this env file too")
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
        if not line_given and args.units:
            flags["line_id"] = SIMULATED_LINE
            flags["devices"] = ",".join(
                f"{SIMULATED_LINE}-t{n:02d}@{n}" for n in range(1, args.units + 1)
            )
        elif not line_given:
            flags["device_id"] = SIMULATED_DEVICE
        if not _configured("AGENT_INSTANCE_ID", flags, "instance_id"):
            flags["instance_id"] = "a"
        if not _configured("AGENT_STATE_DIR", flags, "state_dir") and not os.environ.get(
            "STATE_DIRECTORY"
        ):
            flags["state_dir"] = tempfile.mkdtemp(prefix="agent-simulate-")
    settings = AgentSettings(_env_file=args.env_file, **flags)  # type: ignore[call-arg]
    if not args.simulate and not settings.serial.url:
        raise ConfigError(
            "AGENT_SERIAL__URL (serial.url): required: a device path such as "
            "/dev/serial/by-id/..., or socket://HOST:PORT"
        )
    return settings


class ConfigError(Exception):
    pass


def main(argv: Sequence[str], subcommands: Sequence[str] = ()) -> int:
    parser = build_parser(subcommands)
    args = parser.parse_args(argv)
    if (args.pair or args.units) and not args.simulate:
        parser.error("--pair and --units work with --simulate")
    if not 0 <= args.units <= 247:
        parser.error("--units: a line has 1 to 247 addresses")
    if args.env_file is not None and not args.env_file.is_file():
        print(f"agent: --env-file {args.env_file}: no such file", file=sys.stderr)
        return EXIT_CONFIG
    try:
        settings = load_settings(args)
    except ValidationError as exc:
        for line in setting_errors(exc):
            print(f"agent: invalid setting {line}", file=sys.stderr)
        return EXIT_CONFIG
    except ConfigError as exc:
        print(f"agent: invalid setting {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.print_config:
        shown = redacted(settings)
        shown["derived"] = {
            "line_id": settings.line.id,
            "client_id": settings.client_id,
            "lock_key": settings.lock_key,
            "line_telemetry_topic": settings.telemetry_line_topic,
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
    logs.setup(settings.log_level)
    if args.simulate:
        from agent.runtime.simulate import simulate

        broker_configured = _configured("AGENT_MQTT__HOST", _flag_settings(args), "mqtt", "host")
        return asyncio.run(simulate(settings, pair=args.pair, use_broker=broker_configured))
    return asyncio.run(_run(settings))


async def _run(settings: AgentSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    notifier = Notifier()
    try:
        return await Agent(settings, notifier=notifier).run(stop)
    finally:
        notifier.close()
