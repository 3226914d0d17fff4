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
import os
import re
import socket
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

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
        if value is not None and not value.is_file():
            raise ValueError(f"file not found: {value}")
        return value

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
    keepalive_s: Annotated[int, Field(ge=1, le=65535)] = Field(
        default=10,
        description="MQTT keep-alive; a dead link is noticed after about twice this.",
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
        variable = ENV_PREFIX + ENV_NESTED_DELIMITER.join(path).upper() if path else "settings"
        message = error["msg"].removeprefix("Value error, ")
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
    reply_timeout_s: Annotated[float, Field(gt=0, le=30)] = Field(
        default=0.5, description="How long to wait for the controller's reply."
    )
    min_write_interval_s: Annotated[float, Field(ge=0)] = Field(
        default=1.0, description="Least time between two writes (spares the EEPROM)."
    )
    poll_interval_s: Annotated[float, Field(gt=0)] = Field(
        default=1.0, description="How often the controller is read for local changes."
    )
    modbus_unit_id: Annotated[int, Field(ge=1, le=247)] = 1
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
        default="devices/{device}/telemetry", description="Topic; {device} is replaced."
    )
    jitter_s: Annotated[float, Field(ge=0)] = Field(
        default=1.0, description="Random delay added to each publication."
    )

    @field_validator("topic")
    @classmethod
    def _valid_topic(cls, value: str) -> str:
        if not value or "+" in value or "#" in value:
            raise ValueError("must be a topic name without wildcards")
        try:
            value.format(device="d")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{device}} may be substituted ({exc})") from None
        return value


class KeySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    setpoint: str = Field(default="{device}\\setPoint", description="Key of the set point.")
    lock: str = Field(default="{device}\\lock", description="Key of the pair's lock.")

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        for name in ("setpoint", "lock"):
            try:
                getattr(self, name).format(device="d")
            except (KeyError, IndexError, ValueError):
                raise ValueError(f"keys.{name}: only {{device}} may be substituted") from None
        if self.setpoint == self.lock:
            raise ValueError("keys.setpoint and keys.lock must differ")
        return self


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


class AgentSettings(BaseSettings):
    """Everything the agent reads: environment (AGENT_...), an env file, credentials, flags."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="ignore",
        hide_input_in_errors=True,
    )

    device_id: str = Field(description="The device this pair of instances serves.")
    instance_id: str = Field(
        default_factory=socket.gethostname,
        description="This instance, unique within the pair (default: the host name).",
    )
    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Where the last synced state is kept ($STATE_DIRECTORY under systemd).",
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

    @field_validator("device_id", "instance_id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        if not _DEVICE_ID.fullmatch(value):
            raise ValueError(
                "use letters, digits and . _ : - (no spaces, '/', '+' or '#'), starting with "
                "a letter or digit"
            )
        return value

    @property
    def client_id(self) -> str:
        return self.mqtt.client_id or default_client_id(self.device_id, self.instance_id)

    @property
    def setpoint_key(self) -> str:
        return self.keys.setpoint.format(device=self.device_id)

    @property
    def lock_key(self) -> str:
        return self.keys.lock.format(device=self.device_id)

    @property
    def telemetry_topic(self) -> str:
        return self.telemetry.topic.format(device=self.device_id)
