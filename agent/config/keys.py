"""The state store's key names (``AGENT_KEYS__...``): per device and per line."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
