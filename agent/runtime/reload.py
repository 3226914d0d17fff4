"""A reload (SIGHUP, `systemctl reload`): the devices and profiles read again and applied
to the running line, without losing the lease or disturbing the devices that did not change.

What a reload can change is the line's devices (AGENT_DEVICES_FILE, AGENT_PROFILES_FILE,
and AGENT_DEVICES from --env-file): a device added is watched, and taken over on the line
by an active at once; one removed is let go (its work in progress ends first); one whose
settings changed (address, profile, write interval, Modbus map) is both. Everything else
(the serial port and line settings, the broker, keys, the lease) takes a restart: said,
and left as it runs. A configuration that does not load is refused whole, and the running
one stays.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.client.statestore import StateStoreClient
from agent.config import as_running
from agent.config.line import Line
from agent.line.bus import Bus
from agent.runtime.devices import unwatch_device
from agent.runtime.line import make_units, write_intervals
from agent.sync.device import DeviceSync

if TYPE_CHECKING:
    from agent.config import AgentSettings, DeviceSettings

log = logging.getLogger("agent")

QUIESCE_S = 5.0


# --------------------------------------------------------------------------- pure


@dataclass(frozen=True, slots=True)
class DeviceChanges:
    added: tuple[DeviceSettings, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[DeviceSettings, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def words(self) -> str:
        parts = [
            f"{what} {', '.join(names)}"
            for what, names in (
                ("added", [d.id for d in self.added]),
                ("removed", list(self.removed)),
                ("changed", [d.id for d in self.changed]),
            )
            if names
        ]
        return "; ".join(parts) or "no device changed"


def _same(old: DeviceSettings, new: DeviceSettings) -> bool:
    return old.model_dump() == new.model_dump() and old.resolved_profile == new.resolved_profile


def device_changes(old: Line, new: Line) -> DeviceChanges:
    before = {device.id: device for device in old.devices}
    after = {device.id: device for device in new.devices}
    return DeviceChanges(
        added=tuple(d for name, d in after.items() if name not in before),
        removed=tuple(name for name in before if name not in after),
        changed=tuple(
            d for name, d in after.items() if name in before and not _same(before[name], d)
        ),
    )


LINE_SETTINGS = ("line_id", "devices", "devices_file", "profiles_file", "device_id")


def why_not_reloadable(old: AgentSettings, new: AgentSettings) -> str | None:
    """Why `new` cannot replace `old` in a running process, or None. What would not start
    is refused as at start: an active that kept the lease of a line it serves no device
    of would keep its standby from ever taking the line over."""
    if not new.line.devices:
        return (
            f"no device of line {new.line.id} can be served (the devices list is empty): "
            "a line without devices does not start, and is not reloaded"
        )
    if new.line.id != old.line.id:
        return (
            f"the line's id changed from {old.line.id} to {new.line.id} (AGENT_LINE_ID): "
            "another line takes a restart"
        )
    if new.line.single != old.line.single:
        return "a single device became a line or the other way round: that takes a restart"
    return None


def restart_only(old: AgentSettings, new: AgentSettings) -> list[str]:
    """The settings that differ but only a restart applies, by variable name."""
    before = old.model_dump(exclude=set(LINE_SETTINGS))
    after = new.model_dump(exclude=set(LINE_SETTINGS))
    return sorted(f"AGENT_{name.upper()}" for name in before if before[name] != after.get(name))


def running(old: AgentSettings, new: AgentSettings) -> AgentSettings:
    """The settings the process runs after the reload: the old ones with the new line."""
    return as_running(old).model_copy(update={"_line": as_running(new).line})


# --------------------------------------------------------------------------- applying


async def apply(
    changes: DeviceChanges,
    settings: AgentSettings,
    devices: dict[str, DeviceSync],
    *,
    make: Callable[[DeviceSettings], DeviceSync],
    watch: Callable[[str, DeviceSync], Awaitable[tuple[bool, object]]],
    client: StateStoreClient,
    bus: Bus | None,
) -> None:
    """Applies `changes` (the settings already the new running ones) to `devices`: the
    devices that go are let go first, then the new ones are watched (`watch` says whether
    one can be served: one that cannot is left out) and, on an open line, taken over."""
    for name in (*changes.removed, *(d.id for d in changes.changed)):
        sync = devices.pop(name, None)
        if sync is None:
            continue
        if bus is not None:
            bus.remove_unit(name)
        await sync.quiesce(QUIESCE_S)  # a write on the line ends before the device goes
        sync.release()
        await sync.stop()
        await unwatch_device(client, sync)
    units = {unit.name: unit for unit in make_units(settings)}
    intervals = write_intervals(settings)
    joined = []
    for device in (*changes.changed, *changes.added):
        sync = make(device)
        devices[device.id] = sync  # its keys' notifications find it from the watch on
        served, _ = await watch(device.id, sync)
        if not served:
            del devices[device.id]
        elif bus is not None:
            handle = bus.add_unit(units[device.id], intervals[device.id])
            joined.append((sync, handle))
    if joined:
        await asyncio.gather(*(sync.take_over(handle) for sync, handle in joined))
        for sync, _ in joined:
            sync.start()
