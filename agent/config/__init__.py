"""Settings, read from the environment by pydantic-settings.

Every variable starts with ``AGENT_``; nested fields are joined with ``__``, so the broker host
is ``AGENT_MQTT__HOST`` and the CA file ``AGENT_MQTT__TLS__CA_FILE``. The models here are plain
``BaseModel``s so that every top-level settings class (``ConnectionSettings`` for the tools, the
agent's own richer class later) can reuse them as fields.

Secrets are ``SecretStr``: they print as ``**********`` in reprs, logs and ``model_dump``;
``get_secret_value()`` is called only where the value is handed to the MQTT client or OpenSSL.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

ENV_PREFIX = "AGENT_"
ENV_NESTED_DELIMITER = "__"

# Client ids end up inside topic names (the state store's response topic embeds the client id),
# so wildcards and level separators would break routing.
_CLIENT_ID_FORBIDDEN = re.compile(r"[+#/\x00-\x1f\x7f]")
_CLIENT_ID_MAX_BYTES = 256
# What default_client_id keeps of the device and instance ids; everything else becomes "-".
_CLIENT_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_DEFAULT_CLIENT_ID_MAX = 64

# Mistyped variables are errors, not silently ignored. Validation errors would otherwise quote
# the raw input, and for a model-level check that is the whole model, passwords included.
_MODEL_CONFIG = ConfigDict(extra="forbid", hide_input_in_errors=True)


def _existing_file(value: Path | None) -> Path | None:
    if value is not None and not value.is_file():
        raise ValueError(f"file not found: {value}")
    return value


class TlsSettings(BaseModel):
    """TLS towards the broker. Setting any of the files turns TLS on."""

    model_config = _MODEL_CONFIG

    enabled: bool = Field(
        default=False,
        description="Use TLS. Implied when ca_file, cert_file or key_file is set.",
    )
    ca_file: Path | None = Field(
        default=None,
        description="PEM file of the CA(s) that signed the broker's certificate "
        "(default: the system trust store).",
    )
    cert_file: Path | None = Field(
        default=None, description="PEM client certificate (X.509 authentication)."
    )
    key_file: Path | None = Field(default=None, description="PEM private key of cert_file.")
    key_password: SecretStr | None = Field(
        default=None, description="Password of an encrypted key_file."
    )

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _file_exists(cls, value: Path | None) -> Path | None:
        return _existing_file(value)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        files = [
            name for name in ("ca_file", "cert_file", "key_file") if getattr(self, name) is not None
        ]
        if files and not self.enabled:
            if "enabled" in self.model_fields_set:
                # Silently ignoring configured certificates would be a trap.
                raise ValueError(f"tls.enabled is false but tls.{files[0]} is set")
            self.enabled = True
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.cert_file and tls.key_file must be set together")
        if self.key_password is not None and self.key_file is None:
            raise ValueError("tls.key_password is set but tls.key_file is not")
        return self


class MqttSettings(BaseModel):
    """The MQTT 5 connection to the broker (the Azure IoT Operations MQTT broker, or mosquitto)."""

    model_config = _MODEL_CONFIG

    host: Annotated[str, Field(min_length=1)] = "localhost"
    port: Annotated[int, Field(ge=1, le=65535)] = 1883
    client_id: str | None = Field(
        default=None,
        description="MQTT client id; must be unique per running instance "
        "(default: derived from the device id and the instance id).",
    )
    username: str | None = None
    password: SecretStr | None = None
    sat_file: Path | None = Field(
        default=None,
        description="Kubernetes service account token file: authenticate with MQTT 5 enhanced "
        "authentication, method K8S-SAT (as the Azure IoT Operations broker requires in a "
        "cluster). Read anew on every connect, so a rotated token is used.",
    )
    keepalive_s: Annotated[int, Field(ge=1, le=65535)] = Field(
        default=10,
        description="MQTT keep-alive; a dead link is noticed within this much silence from "
        "the broker (a PINGREQ after half of it, unanswered for the other half).",
    )
    connect_timeout_s: Annotated[float, Field(gt=0)] = Field(
        default=10.0, description="Bound on each connection attempt (TCP, TLS and CONNACK)."
    )
    reconnect_min_s: Annotated[float, Field(gt=0)] = Field(
        default=0.5, description="First reconnect backoff ceiling (doubles per failed attempt)."
    )
    reconnect_max_s: Annotated[float, Field(gt=0)] = Field(
        default=30.0, description="Largest reconnect backoff ceiling."
    )
    request_timeout_s: Annotated[float, Field(gt=0)] = Field(
        default=10.0, description="Default bound on a publish, subscribe or unsubscribe."
    )
    max_inflight: Annotated[int, Field(ge=1, le=65535)] = Field(
        default=100,
        description="Cap on unacknowledged QoS 1 publishes; the broker's Receive Maximum "
        "lowers it further.",
    )
    tls: TlsSettings = Field(default_factory=TlsSettings)

    @field_validator("client_id")
    @classmethod
    def _valid_client_id(cls, value: str | None) -> str | None:
        if value is not None:
            check_client_id(value)
        return value

    @field_validator("sat_file")
    @classmethod
    def _sat_file_exists(cls, value: Path | None) -> Path | None:
        return _existing_file(value)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.reconnect_min_s > self.reconnect_max_s:
            raise ValueError(
                f"reconnect_min_s ({self.reconnect_min_s}) must not exceed "
                f"reconnect_max_s ({self.reconnect_max_s})"
            )
        if self.password is not None and self.username is None:
            # MQTT 5 would allow it, but gmqtt only sends a password along with a user name.
            raise ValueError("password is set but username is not")
        if self.password is not None and self.sat_file is not None:
            # Two ways of proving who we are: the broker would see only one of them.
            raise ValueError("set either password or sat_file, not both")
        return self


class ConnectionSettings(BaseSettings):
    """What the tools that only talk to the broker (``agent store``) read from the environment."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="ignore",
        hide_input_in_errors=True,
    )

    mqtt: MqttSettings = Field(default_factory=MqttSettings)


def check_client_id(client_id: str) -> str:
    """Raise ValueError unless client_id is usable as an MQTT client id and inside topics."""
    if not client_id:
        raise ValueError("client id must not be empty")
    if len(client_id.encode()) > _CLIENT_ID_MAX_BYTES:
        raise ValueError(f"client id is longer than {_CLIENT_ID_MAX_BYTES} bytes")
    bad = _CLIENT_ID_FORBIDDEN.search(client_id)
    if bad:
        raise ValueError(f"client id must not contain {bad.group()!r}")
    return client_id


def default_client_id(device_id: str, instance_id: str, *, prefix: str = "agent") -> str:
    """A stable client id for one instance on one device: ``agent-<device>-<instance>``.

    The same device and instance always give the same id, so a restarted instance takes over its
    own session at the broker; a different instance id gives a different client id. Characters
    outside ``A-Za-z0-9._-`` become ``-``; an id longer than 64 characters is cut and suffixed
    with a hash of the full id so that it stays unique.
    """
    if not device_id or not instance_id:
        raise ValueError("device id and instance id must not be empty")
    raw = f"{prefix}-{device_id}-{instance_id}"
    safe = _CLIENT_ID_UNSAFE.sub("-", raw)
    if len(safe) > _DEFAULT_CLIENT_ID_MAX or safe != raw:
        # Hash the original so that two ids differing only in replaced characters stay distinct.
        digest = hashlib.sha256(raw.encode()).hexdigest()[:10]
        safe = f"{safe[: _DEFAULT_CLIENT_ID_MAX - len(digest) - 1]}-{digest}"
    return check_client_id(safe)


def redacted(settings: BaseModel) -> dict[str, Any]:
    """The settings as JSON-ready data with every secret masked, for logs and diagnostics."""
    return settings.model_dump(mode="json")


def setting_errors(exc: ValidationError, *, within: tuple[str, ...] = ()) -> list[str]:
    """One line per invalid setting, naming it as its environment variable.

    ``within`` is where the validated model sits under the top-level settings (``("mqtt",)``
    when an ``MqttSettings`` was validated on its own).
    """
    lines = []
    for error in exc.errors():
        path = [*within, *(str(part) for part in error["loc"])]
        # A list (AGENT_DEVICES) is one variable: its items are not variables of their own.
        named = path[: next((i for i, part in enumerate(path) if part.isdigit()), len(path))]
        variable = ENV_PREFIX + ENV_NESTED_DELIMITER.join(named).upper() if named else "settings"
        message = error["msg"].removeprefix("Value error, ")
        if not path and message.startswith(ENV_PREFIX):
            lines.append(message)  # a check across settings names its variables itself
            continue
        lines.append(f"{variable} ({'.'.join(path) or 'settings'}): {message}")
    return lines


# --------------------------------------------------------------------------- the agent

# A device id appears in topics and key names: no MQTT wildcards, separators or spaces.
_DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


class SerialSettings(BaseModel):
    """The local controller's line."""

    model_config = ConfigDict(extra="forbid")

    driver: Literal["line", "modbus"] = Field(
        default="line", description="line (ASCII line protocol) or modbus (Modbus RTU)."
    )
    url: str = Field(
        default="",
        description="Device path (/dev/serial/by-id/...), socket://HOST:PORT or "
        "rfc2217://HOST:PORT. Required, except with --simulate.",
    )
    baudrate: Annotated[int, Field(gt=0)] = 9600
    parity: Literal["N", "E", "O"] = "N"
    bytesize: Annotated[int, Field(ge=7, le=8)] = 8
    stopbits: Annotated[int, Field(ge=1, le=2)] = 1
    reply_timeout_s: Annotated[float, Field(gt=0, le=30)] | None = Field(
        default=None,
        description="How long to wait for a controller's reply (default: from the baud "
        "rate and the protocol's turnaround, a few hundred milliseconds).",
    )
    extra_gap_s: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.0,
        description="Quiet time added to the silent interval between transactions, for "
        "slow devices.",
    )
    probe_interval_s: Annotated[float, Field(gt=0)] = Field(
        default=30.0,
        description="How soon a device that stopped answering is tried again (then less "
        "often, up to ten times this); the others are served meanwhile.",
    )
    lock_dir: Path | None = Field(
        default=Path("/run/lock"),
        description="Where a local port is claimed, so that two lines on this gateway never "
        "open the same port (empty: no claim).",
    )
    min_write_interval_s: Annotated[float, Field(ge=0)] = Field(
        default=1.0, description="Least time between two writes (spares the EEPROM)."
    )
    poll_interval_s: Annotated[float, Field(gt=0)] = Field(
        default=1.0,
        description="How often every controller is read for local changes (one poll cycle).",
    )
    modbus_unit_id: Annotated[int, Field(ge=1, le=247)] = Field(
        default=1, description="The unit id of a single device (AGENT_DEVICES gives each its own)."
    )
    modbus_setpoint_register: Annotated[int, Field(ge=0, le=65535)] = 0
    modbus_temperature_register: Annotated[int, Field(ge=0, le=65535)] = 1
    modbus_scale: Annotated[float, Field(gt=0)] = Field(
        default=10.0, description="Register value = degrees x scale."
    )
    modbus_signed: bool = True
    modbus_read_function: Annotated[int, Field(ge=3, le=4)] = Field(
        default=3, description="3 (holding registers) or 4 (input registers)."
    )
    modbus_write_function: int = Field(
        default=6, description="6 (write single register) or 16 (write multiple)."
    )

    @field_validator("lock_dir", mode="before")
    @classmethod
    def _no_lock_dir(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("modbus_write_function")
    @classmethod
    def _write_function(cls, value: int) -> int:
        if value not in (6, 16):
            raise ValueError("must be 6 or 16")
        return value


class LockSettings(BaseModel):
    """The leased lock that makes one instance of a pair active."""

    model_config = ConfigDict(extra="forbid")

    ttl_ms: Annotated[int, Field(ge=300, le=600_000)] = Field(
        default=3000, description="Lease length; renewed every third of it."
    )
    safety_margin_ms: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="The active gives up this long before the lease ends "
        "(default: 10% of the TTL, 50 ms to 1 s).",
    )

    @model_validator(mode="after")
    def _margin_below_ttl(self) -> Self:
        if self.safety_margin_ms is not None and self.safety_margin_ms * 2 >= self.ttl_ms:
            raise ValueError("safety_margin_ms must be less than half of ttl_ms")
        return self


class TelemetrySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    interval_s: Annotated[float, Field(gt=0)] = Field(
        default=10.0, description="How often telemetry is published."
    )
    topic: str = Field(
        default="devices/{device}/telemetry",
        description="Each device's topic; {device} is replaced.",
    )
    line_topic: str = Field(
        default="lines/{line}/telemetry",
        description="The line's own topic (its transactions, errors, cycle time); {line} "
        "is replaced.",
    )
    jitter_s: Annotated[float, Field(ge=0)] = Field(
        default=1.0, description="Random delay added to each publication."
    )

    @field_validator("topic", "line_topic")
    @classmethod
    def _valid_topic(cls, value: str) -> str:
        if not value or "+" in value or "#" in value:
            raise ValueError("must be a topic name without wildcards")
        try:
            value.format(device="d", line="l")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{device}} and {{line}} may be substituted ({exc})") from None
        return value


class HealthSettings(BaseModel):
    """What each instance says about itself and its devices, for monitoring and `agent status`."""

    model_config = ConfigDict(extra="forbid")

    topic: str = Field(
        default="agents/{line}/{instance}/health",
        description='Each instance\'s retained health message ({"status":"up",...}), '
        "with a Last Will saying down; {line} and {instance} are replaced.",
    )
    device_topic: str = Field(
        default="devices/{device}/status",
        description="Each device's retained status, published by the active; {device} is replaced.",
    )
    availability_topic: str = Field(
        default="devices/{device}/availability",
        description="Each device's retained availability (online or offline), published by "
        "the active; {device} is replaced.",
    )
    interval_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=5.0,
        description="How often the health message is published again (a heartbeat); the "
        "device statuses follow changes, at most once a second each, and every interval.",
    )
    host: str = Field(
        default="127.0.0.1", description="Address the HTTP health endpoint listens on."
    )
    port: Annotated[int, Field(ge=0, le=65535)] | None = Field(
        default=None,
        description="Port of the HTTP health endpoint (/health, /leader, /replica, ...); "
        "not set: no endpoint; 0: any free port (logged).",
    )

    @field_validator("port", mode="before")
    @classmethod
    def _no_port(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("topic", "device_topic", "availability_topic")
    @classmethod
    def _valid_topic(cls, value: str) -> str:
        if not value or "+" in value or "#" in value:
            raise ValueError("must be a topic name without wildcards")
        try:
            value.format(device="d", line="l", instance="i")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"only {{device}}, {{line}} and {{instance}} may be substituted ({exc})"
            ) from None
        return value

    def instance_topic(self, line: str, instance: str) -> str:
        return self.topic.format(line=line, instance=instance, device=line)

    def device_status_topic(self, device: str, line: str) -> str:
        return self.device_topic.format(device=device, line=line, instance="")

    def device_availability_topic(self, device: str, line: str) -> str:
        return self.availability_topic.format(device=device, line=line, instance="")


class KeySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    setpoint: str = Field(default="{device}\\setPoint", description="Key of a set point.")
    synced: str = Field(
        default="{device}\\synced",
        description="Key of a device's sync record: what the active last had on it.",
    )
    line: str = Field(
        default="{device}\\line",
        description="Key naming a device's line, for writers who know only the device.",
    )
    lock: str = Field(default="{line}\\lock", description="Key of the pair's lock, one per line.")
    paused: str = Field(
        default="{line}\\paused",
        description="Key that pauses a line while it exists (agent pause / agent resume).",
    )
    switchover: str = Field(
        default="{line}\\switchover",
        description="Key of a planned handover's request (agent switchover).",
    )

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        per_device = ("setpoint", "synced", "line")
        per_line = ("lock", "paused", "switchover")
        for name in (*per_device, *per_line):
            try:
                getattr(self, name).format(device="d", line="l")
            except (KeyError, IndexError, ValueError):
                raise ValueError(
                    f"keys.{name}: only {{device}} and {{line}} may be substituted"
                ) from None
        for name in per_device:
            if "{device}" not in getattr(self, name):
                raise ValueError(f"keys.{name} must contain {{device}}: one key per device")
        names = (*per_device, *per_line)
        if len({getattr(self, name) for name in names}) < len(names):
            raise ValueError(
                "keys.setpoint, keys.synced, keys.line, keys.lock, keys.paused and "
                "keys.switchover must differ"
            )
        return self

    def of(self, name: str, *, device: str, line: str) -> str:
        template: str = getattr(self, name)
        return template.format(device=device, line=line)

    def of_line(self, name: str, line: str) -> str:
        """A line's key: `lock`, `paused` or `switchover` ({device} is the line's id too, as
        for a single device that is its own line)."""
        return self.of(name, device=line, line=line)


# The credential files (systemd LoadCredential=) and the secret each one holds.
CREDENTIAL_FILES: dict[str, tuple[str, ...]] = {
    "mqtt-password": ("mqtt", "password"),
    "mqtt-key-password": ("mqtt", "tls", "key_password"),
}


class _CredentialsSource(PydanticBaseSettingsSource):
    """Secrets from files in $CREDENTIALS_DIRECTORY (systemd LoadCredential=)."""

    FILES: ClassVar[dict[str, tuple[str, ...]]] = CREDENTIAL_FILES

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        directory = os.environ.get("CREDENTIALS_DIRECTORY")
        found: dict[str, Any] = {}
        if not directory:
            return found
        for name, path in self.FILES.items():
            file = Path(directory) / name
            if file.is_file():
                node = found
                for part in path[:-1]:
                    node = node.setdefault(part, {})
                node[path[-1]] = file.read_text().rstrip("\n")
        return found


def _default_state_dir() -> Path:
    # systemd's StateDirectory= sets STATE_DIRECTORY (colon-separated if several).
    state = os.environ.get("STATE_DIRECTORY")
    return Path(state.split(":")[0]) if state else Path("/var/lib/agent")


MAX_UNIT_LOADS = 32
"""RS-485 drives 32 unit loads per segment: more devices than that is worth a warning."""


class ModbusOverrides(BaseModel):
    """A device whose registers differ from the line's (AGENT_SERIAL__MODBUS_*)."""

    model_config = ConfigDict(extra="forbid")

    setpoint_register: Annotated[int, Field(ge=0, le=65535)] | None = None
    temperature_register: Annotated[int, Field(ge=0, le=65535)] | None = None
    scale: Annotated[float, Field(gt=0)] | None = None
    signed: bool | None = None
    read_function: Annotated[int, Field(ge=3, le=4)] | None = None
    write_function: Literal[6, 16] | None = None


class DeviceSettings(BaseModel):
    """One controller on the line: `id@address` in AGENT_DEVICES, or an object in its JSON
    form (or in the file AGENT_DEVICES_FILE) for one that differs from the others."""

    model_config = ConfigDict(extra="forbid")

    id: str
    address: Annotated[int, Field(ge=1, le=247)] | None = None
    min_write_interval_s: Annotated[float, Field(ge=0)] | None = None
    modbus: ModbusOverrides | None = None

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        return check_id(value)


def check_id(value: str) -> str:
    if not _DEVICE_ID.fullmatch(value):
        raise ValueError(
            f"{value!r}: use letters, digits and . _ : - (no spaces, '/', '+', '#' or '@'), "
            "starting with a letter or digit"
        )
    return value


def parse_devices(value: object) -> object:
    """`id@address,id@address` or a JSON array, as AGENT_DEVICES gives them."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return None
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON array of devices: {exc}") from None
    devices = []
    for entry in text.split(","):
        name, at, address = entry.strip().partition("@")
        if not at or not name or not address.strip().isdigit():
            raise ValueError(f"{entry.strip()!r}: expected id@address, e.g. floor3-t01@1")
        devices.append({"id": name, "address": int(address)})
    return devices


@dataclass(frozen=True, slots=True)
class Line:
    """The line this agent serves and its devices, from the settings."""

    id: str
    devices: tuple[DeviceSettings, ...]
    single: bool
    """Configured as one device (AGENT_DEVICE_ID): keys and lock as for a device."""


class AgentSettings(BaseSettings):
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
        default=None, description="A JSON file holding the devices, instead of AGENT_DEVICES."
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

    @field_validator("devices_file")
    @classmethod
    def _devices_file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file not found: {value}")
        return value

    @model_validator(mode="after")
    def _one_line(self) -> Self:
        self._line = resolve_line(self)
        return self

    @property
    def line(self) -> Line:
        assert self._line is not None
        return self._line

    @property
    def client_id(self) -> str:
        return self.mqtt.client_id or default_client_id(self.line.id, self.instance_id)

    @property
    def lock_key(self) -> str:
        return self.keys.lock.format(line=self.line.id, device=self.line.id)

    def key(self, name: str, device: str) -> str:
        """A device's key: `setpoint`, `synced` or `line`."""
        return self.keys.of(name, device=device, line=self.line.id)

    @property
    def telemetry_line_topic(self) -> str:
        return self.telemetry.line_topic.format(line=self.line.id, device=self.line.id)

    def telemetry_topic(self, device: str) -> str:
        return self.telemetry.topic.format(device=device, line=self.line.id)


def check_devices(devices: list[DeviceSettings]) -> None:
    """Raises ValueError for ids or addresses given twice, or a missing address."""
    seen_ids: dict[str, int] = {}
    seen_addresses: dict[int, str] = {}
    for device in devices:
        if device.id in seen_ids:
            raise ValueError(f"device {device.id} is given twice")
        seen_ids[device.id] = 1
        if device.address is None:
            if len(devices) > 1:
                raise ValueError(f"device {device.id} has no address (id@address)")
            continue
        if device.address in seen_addresses:
            raise ValueError(
                f"address {device.address} is given to both {seen_addresses[device.address]} "
                f"and {device.id}"
            )
        seen_addresses[device.address] = device.id


class LineConfigError(ValueError):
    """Settings that do not describe one line; the message names the variables."""


def resolve_line(settings: AgentSettings) -> Line:
    if settings.devices is not None and settings.devices_file is not None:
        raise LineConfigError(
            "AGENT_DEVICES and AGENT_DEVICES_FILE are both set: give the devices once"
        )
    devices = settings.devices
    if settings.devices_file is not None:
        try:
            raw = parse_devices(settings.devices_file.read_text())
            if not isinstance(raw, list):
                raise ValueError("expected a list of devices")
            devices = [DeviceSettings.model_validate(entry) for entry in raw]
            check_devices(devices)
        except (OSError, ValueError, TypeError) as exc:
            raise LineConfigError(f"AGENT_DEVICES_FILE ({settings.devices_file}): {exc}") from None
    if devices is not None:
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
        return Line(settings.line_id, tuple(devices), single=False)
    device_id = settings.device_id or settings.line_id
    if device_id is None:
        raise LineConfigError(
            "AGENT_DEVICES (devices): required: the devices on the line, e.g. "
            "floor3-t01@1,floor3-t02@2 (or AGENT_DEVICE_ID for a single device)"
        )
    single = DeviceSettings(id=device_id)
    return Line(settings.line_id or device_id, (single,), single=True)
