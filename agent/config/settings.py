"""The top-level settings, composed of the sections: ``ConnectionSettings`` for the tools that
only talk to the broker, ``AgentSettings`` for the agent, with where its settings come from and
the one line they must describe (``resolve_line``)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from agent.config.credentials import _CredentialsSource
from agent.config.devices import DeviceSettings, check_devices, parse_devices
from agent.config.health import HealthSettings
from agent.config.keys import KeySettings
from agent.config.line import Line, check_id
from agent.config.lock import LockSettings
from agent.config.mqtt import MqttSettings
from agent.config.names import ENV_NESTED_DELIMITER, ENV_PREFIX
from agent.config.profiles import BUILT_IN, read_devices_file, read_profiles_file, resolve
from agent.config.running import AgentMixin
from agent.config.serial import SerialSettings
from agent.config.telemetry import TelemetrySettings


class ConnectionSettings(BaseSettings):
    """What the tools that only talk to the broker (``agent store``) read from the environment."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="ignore",
        hide_input_in_errors=True,
    )

    mqtt: MqttSettings = Field(default_factory=MqttSettings)


def _default_state_dir() -> Path:
    # systemd's StateDirectory= sets STATE_DIRECTORY (colon-separated if several).
    state = os.environ.get("STATE_DIRECTORY")
    return Path(state.split(":")[0]) if state else Path("/var/lib/agent")


class AgentSettings(AgentMixin, BaseSettings):
    """Everything the agent reads: environment (AGENT_...), an env file, credentials, flags."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="ignore",
        hide_input_in_errors=True,
    )

    line_id: str | None = Field(
        default=None,
        description="The line this pair of instances serves, the same on both gateways "
        "(default: the device id of a single device).",
    )
    devices: Annotated[list[DeviceSettings] | None, NoDecode] = Field(
        default=None,
        description="The devices on the line: id@address separated by commas "
        "(floor3-t01@1,floor3-t02@2), or a JSON array of objects (id, address, "
        "min_write_interval_s, modbus: {setpoint_register, ...}).",
    )
    devices_file: Path | None = Field(
        default=None,
        description="A JSON file holding the devices, instead of AGENT_DEVICES: a list of "
        'them, or {"profiles": {name: profile}, "devices": [...]}.',
    )
    profiles_file: Path | None = Field(
        default=None,
        description="A JSON file of profiles ({name: profile}) that devices name "
        '("profile": "<name>"), beside those of AGENT_DEVICES_FILE and the built-in sim.',
    )
    device_id: str | None = Field(
        default=None, description="A single device on its own line (instead of AGENT_DEVICES)."
    )
    instance_id: str = Field(
        default_factory=socket.gethostname,
        description="This instance, unique within the pair (default: the host name).",
    )
    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Where the last synced states are kept ($STATE_DIRECTORY under systemd).",
    )
    reconcile_interval_s: Annotated[float, Field(gt=0)] = Field(
        default=60.0, description="How often store and controller are compared as a safety net."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    keys: KeySettings = Field(default_factory=KeySettings)
    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    serial: SerialSettings = Field(default_factory=SerialSettings)
    lock: LockSettings = Field(default_factory=LockSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    _line: Line | None = PrivateAttr(default=None)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags, then the environment, then the env file, then credential files.
        return (init_settings, env_settings, dotenv_settings, _CredentialsSource(settings_cls))

    @field_validator("line_id", "device_id", "instance_id")
    @classmethod
    def _valid_id(cls, value: str | None) -> str | None:
        return None if value is None else check_id(value)

    @field_validator("devices", mode="before")
    @classmethod
    def _parse_devices(cls, value: object) -> object:
        return parse_devices(value)

    @field_validator("devices")
    @classmethod
    def _distinct_devices(cls, value: list[DeviceSettings] | None) -> list[DeviceSettings] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("no devices given")
        check_devices(value)
        return value

    @field_validator("devices_file", "profiles_file")
    @classmethod
    def _devices_file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file not found: {value}")
        return value

    @model_validator(mode="after")
    def _one_line(self) -> Self:
        self._line = resolve_line(self)
        return self


class LineConfigError(ValueError):
    """Settings that do not describe one line; the message names the variables."""


def resolve_line(settings: AgentSettings) -> Line:
    if settings.devices is not None and settings.devices_file is not None:
        raise LineConfigError(
            "AGENT_DEVICES and AGENT_DEVICES_FILE are both set: give the devices once"
        )
    devices = settings.devices
    profiles = dict(BUILT_IN)
    if settings.profiles_file is not None:
        try:
            profiles |= read_profiles_file(settings.profiles_file)
        except (OSError, ValueError) as exc:
            where = f"AGENT_PROFILES_FILE ({settings.profiles_file})"
            raise LineConfigError(f"{where}: {exc}") from None
    source = "AGENT_DEVICES (devices)"
    if settings.devices_file is not None:
        source = f"AGENT_DEVICES_FILE ({settings.devices_file})"
        try:
            listed, defined = read_devices_file(settings.devices_file.read_text())
            twice = sorted(set(defined) & set(profiles))
            if twice:
                raise ValueError(f"profile {twice[0]}: defined in AGENT_PROFILES_FILE too")
            profiles |= defined
            raw = parse_devices(listed)
            if not isinstance(raw, list):
                raise ValueError("expected a list of devices")
            devices = [DeviceSettings.model_validate(entry) for entry in raw]
            check_devices(devices)
        except (OSError, ValueError, TypeError) as exc:
            raise LineConfigError(f"{source}: {exc}") from None
    if devices is not None:
        try:
            found = resolve(((d.id, d.profile) for d in devices), profiles, settings.serial.driver)
        except ValueError as exc:
            raise LineConfigError(f"{source}: {exc}") from None
        for device in devices:
            device._profile = found.get(device.id)
        if settings.device_id is not None:
            raise LineConfigError(
                "AGENT_DEVICE_ID and AGENT_DEVICES are both set: a line's devices are "
                "AGENT_DEVICES (AGENT_DEVICE_ID is for a single device)"
            )
        if settings.line_id is None:
            raise LineConfigError(
                "AGENT_LINE_ID (line_id): required with AGENT_DEVICES: the line's name, "
                "the same on both gateways"
            )
        # One unaddressed device on a line of its own name is the single device that
        # AGENT_DEVICE_ID makes (its keys and lock are the same), listed so as to name its
        # profile: said as a device, not as a line of one.
        alone = len(devices) == 1 and devices[0].address is None
        return Line(
            settings.line_id, tuple(devices), single=alone and devices[0].id == settings.line_id
        )
    device_id = settings.device_id or settings.line_id
    if device_id is None:
        raise LineConfigError(
            "AGENT_DEVICES (devices): required: the devices on the line, e.g. "
            "floor3-t01@1,floor3-t02@2 (or AGENT_DEVICE_ID for a single device)"
        )
    single = DeviceSettings(id=device_id)
    return Line(settings.line_id or device_id, (single,), single=True)
