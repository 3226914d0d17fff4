"""The state store's key names (``AGENT_KEYS__...``): per device and per line."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent.config.running import KeysMixin


class KeySettings(KeysMixin, BaseModel):
    model_config = ConfigDict(extra="forbid")

    setpoint: str = Field(default="{device}\\setPoint", description="Key of a set point.")
    synced: str = Field(
        default="{device}\\synced",
        description="Key of a device's sync record: what the active last had on it.",
    )
    point: str = Field(
        default="{device}\\{point}",
        description="Key of a device's other points, with a profile (heatSetPoint, mode, ...).",
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
    history: str = Field(
        default="{line}\\history",
        description="Key of the line's history: takeovers, switchovers, pauses, step-downs "
        "(agent history), the newest kept.",
    )

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        per_device = ("setpoint", "synced", "line")
        per_line = ("lock", "paused", "switchover", "history")
        for name in (*per_device, *per_line):
            try:
                getattr(self, name).format(device="d", line="l")
            except (KeyError, IndexError, ValueError):
                raise ValueError(
                    f"keys.{name}: only {{device}} and {{line}} may be substituted"
                ) from None
        try:
            self.point.format(device="d", line="l", point="p")
        except (KeyError, IndexError, ValueError):
            raise ValueError(
                "keys.point: only {device}, {line} and {point} may be substituted"
            ) from None
        if "{device}" not in self.point or "{point}" not in self.point:
            raise ValueError("keys.point must contain {device} and {point}: one key per point")
        for name in per_device:
            if "{device}" not in getattr(self, name):
                raise ValueError(f"keys.{name} must contain {{device}}: one key per device")
        names = (*per_device, *per_line)
        if len({getattr(self, name) for name in names}) < len(names):
            raise ValueError(
                "keys.setpoint, keys.synced, keys.line, keys.lock, keys.paused, "
                "keys.switchover and keys.history must differ"
            )
        return self
