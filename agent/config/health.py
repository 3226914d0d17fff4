"""Health (``AGENT_HEALTH__...``): the retained health and device status topics, and the HTTP
health endpoint."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent.config.running import HealthMixin

DEFAULT_PORT = 9732
"""The health endpoint's port unless set: on loopback, for the gateway's own Prometheus (or
the agent that forwards to one)."""


class HealthSettings(HealthMixin, BaseModel):
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
        default=DEFAULT_PORT,
        description="Port of the HTTP health endpoint (/health, /leader, /replica, "
        "/metrics, ...); empty: no endpoint; 0: any free port (logged).",
    )
    metrics: bool = Field(
        default=True,
        description="Whether the health endpoint answers /metrics (Prometheus's text format).",
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
