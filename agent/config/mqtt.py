"""The MQTT connection to the broker (``AGENT_MQTT__...``): address, credentials, timings,
and TLS (``AGENT_MQTT__TLS__...``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from agent.config.client_id import check_client_id

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
