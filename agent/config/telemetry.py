"""Telemetry (``AGENT_TELEMETRY__...``): how often, and on which topics."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator


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
