"""The line an agent serves and the ids of its devices: what the running agent needs of the
devices' settings, without pydantic. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agent.controller.profile import Profile

# A device id appears in topics and key names: no MQTT wildcards, separators or spaces.
_DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")

MAX_UNIT_LOADS = 32
"""RS-485 drives 32 unit loads per segment: more devices than that is worth a warning."""


def check_id(value: str) -> str:
    if not _DEVICE_ID.fullmatch(value):
        raise ValueError(
            f"{value!r}: use letters, digits and . _ : - (no spaces, '/', '+', '#' or '@'), "
            "starting with a letter or digit"
        )
    return value


class LineDevice(Protocol):
    """What a line needs of a device (its settings, agent.config.devices, have more)."""

    @property
    def id(self) -> str: ...

    @property
    def resolved_profile(self) -> Profile | None: ...


@dataclass(frozen=True, slots=True)
class Line:
    """The line this agent serves and its devices, from the settings."""

    id: str
    devices: tuple[LineDevice, ...]
    single: bool
    """Configured as one device (AGENT_DEVICE_ID): keys and lock as for a device."""

    def profile(self, device: str) -> Profile | None:
        """The profile of the device with this id (None: the set point alone)."""
        for known in self.devices:
            if known.id == device:
                return known.resolved_profile
        raise KeyError(f"no device {device} on line {self.id}")
