"""Which line or device an operator's name means, pure: the name checked by the rules the
agent applies to its own ids, then looked up among the lines and devices the agents have
reported (in their retained health documents, or a device's `<device>\\line` key), with
close matches suggested for a typo.

A command that acts on a line refuses a name nobody reported: `agent pause floor03` must
not pause nothing while the technician believes the bus is released. `--force` acts on it
anyway (a line whose agents have not started yet).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.config import check_id
from agent.config.nearest import suggestions

EXIT_UNKNOWN = 7
"""The exit code of an operator command given a name no agent has reported."""


class BadName(ValueError):
    """A name the agent would refuse as a line or device id."""


class UnknownName(LookupError):
    """A well-formed name that no agent has reported."""


def check_name(name: str, what: str = "line or device") -> str:
    """The name, if the agent could have it as an id; BadName (saying the rule) if not."""
    try:
        return check_id(name)
    except ValueError as exc:
        raise BadName(f"not a {what} name: {exc}") from None


@dataclass(frozen=True, slots=True)
class Reported:
    """What the agents have said exists."""

    lines: frozenset[str] = frozenset()
    devices: Mapping[str, str] = field(default_factory=dict)
    """Device -> the line that reported it."""

    @classmethod
    def from_health(cls, documents: Iterable[Mapping[str, Any]]) -> Reported:
        """From instance health documents (agent.runtime.health): each names its line and,
        unless it is a Last Will, the line's devices. Anything else is skipped."""
        lines: set[str] = set()
        devices: dict[str, str] = {}
        for document in documents:
            line = document.get("line")
            if not isinstance(line, str) or not line:
                continue
            lines.add(line)
            named = document.get("devices")
            for device in named if isinstance(named, list) else []:
                if isinstance(device, str) and device:
                    devices.setdefault(device, line)
        return cls(frozenset(lines), devices)

    def with_device(self, device: str, line: str) -> Reported:
        """Also the device a `<device>\\line` key names."""
        return Reported(self.lines, {**self.devices, device: line})


@dataclass(frozen=True, slots=True)
class Target:
    line: str
    device: str | None
    """The device named, when the name was a device's."""


def resolve(name: str, reported: Reported, *, devices_only: bool = False) -> Target:
    """The line (and device) `name` means; UnknownName, with close matches, if nobody
    reported it. A name that is both (a single device is its own line) is the device."""
    if name in reported.devices:
        return Target(reported.devices[name], name)
    if not devices_only and name in reported.lines:
        return Target(name, None)
    raise UnknownName(unknown(name, reported, devices_only=devices_only))


def unknown(name: str, reported: Reported, *, devices_only: bool = False) -> str:
    """What to say of a name nobody reported: one line, with close matches."""
    what = "device" if devices_only else "line or device"
    known = set(reported.devices) if devices_only else reported.lines | set(reported.devices)
    text = f"no agent has reported a {what} named {name}"
    matches = suggestions(name, known)
    if matches:
        text += f" (did you mean {' or '.join(matches)}?)"
    elif not known:
        text += " (no agent has reported anything: is this the broker they use?)"
    return text
