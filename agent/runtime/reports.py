"""What an instance reports of its devices and its line, for telemetry and health: built
from the device syncs, the leadership and the bus as they are at the moment asked."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from agent.controller.points import encode
from agent.line.bus import Bus
from agent.protocol.hlc import Hlc
from agent.runtime import telemetry
from agent.runtime.health import DeviceView
from agent.sync.device import DeviceSync


def device_snapshot(
    device_id: str,
    sync: DeviceSync,
    *,
    line: str,
    instance: str,
    active: bool,
    token: Hlc | None,
    lock_losses: int,
    bus: Bus | None,
) -> telemetry.Snapshot:
    controller = sync.controller if active else None
    state = controller.last_state if controller is not None else None
    counters = sync.status.counters
    synced = sync.status.synced
    slow = bus.schedule.slow(device_id) if bus is not None and active else None
    garbled = bus.schedule.errors(device_id) if bus is not None and active else 0
    return telemetry.Snapshot(
        device=device_id,
        line=line,
        instance=instance,
        role="active" if active else "standby",
        setpoint=state.setpoint if state else None,
        temperature=state.temperature if state else None,
        output=state.output if state else None,
        mode=state.mode.value if state and state.mode else None,
        controller=sync.status.controller if active else None,
        fencing_token=str(token) if token and active else None,
        last_sync_time=telemetry.iso_time(sync.status.synced_at),
        last_sync_version=str(synced.version) if synced.version else None,
        errors={
            "invalid_remote_values": counters.invalid_remote_values,
            "controller_errors": counters.controller_errors,
            "garbled_replies": garbled,
            "store_errors": counters.store_errors,
            "fenced_writes_rejected": counters.fenced_writes_rejected,
            "not_authorized": counters.not_authorized,
            "lock_losses": lock_losses,
        },
        slow_ms=None if slow is None else round(slow * 1000, 1),
        points=dict(state.points) if state is not None and state.points else None,
        changes=changes(sync) or None,
    )


def changes(sync: DeviceSync) -> dict[str, dict[str, str | None]]:
    """Each point's last change (agent.sync.status.LastChange), as telemetry says it."""
    said: dict[str, dict[str, str | None]] = {}
    for name, point in sync.points.items():
        change, value = point.status.change, point.status.synced.value
        if change is None:
            continue
        said[name] = {
            "value": None if value is None else encode(point.point, value).decode(),
            "source": change.source,
            "at": telemetry.iso_time(change.at),
            "version": None if change.version is None else str(change.version),
        }
    return said


class LineRate:
    """Transactions a second between two reports."""

    def __init__(self) -> None:
        self._last: tuple[float, int] | None = None

    def per_s(self, transactions: int) -> float | None:
        now = time.monotonic()
        rate = None
        if self._last is not None and now > self._last[0]:
            rate = (transactions - self._last[1]) / (now - self._last[0])
        self._last = (now, transactions)
        return rate


def line_snapshot(
    bus: Bus | None,
    devices: Mapping[str, DeviceSync],
    *,
    line: str,
    instance: str,
    rate: LineRate,
    round_trip_s: float | None = None,
    too_slow: bool = False,
) -> telemetry.LineSnapshot:
    """`bus`: the line as the active drives it; None for the standby. `round_trip_s`: the
    longest of the last round trips to the store; `too_slow`: too long to hold a lease."""
    per_s: float | None = None
    errors: dict[str, int] = {}
    if bus is not None:
        stats = bus.driver.stats
        per_s = rate.per_s(stats.transactions)
        errors = {
            "transactions": stats.transactions,
            "timeouts": stats.timeouts,
            "corrupt_replies": stats.corrupt_replies,
            "withheld": bus.withheld,
            "reopens": bus.reopen_count,
        }
    available = sum(not bus.schedule.quarantined(name) for name in devices) if bus else 0
    return telemetry.LineSnapshot(
        line=line,
        instance=instance,
        role="active" if bus is not None else "standby",
        devices=len(devices),
        available=available,
        line_up=bus.line_up if bus is not None else None,
        transactions_per_s=None if per_s is None else round(per_s, 2),
        cycle_s=bus.schedule.last_cycle_s if bus is not None else None,
        errors=errors,
        round_trip_ms=None if round_trip_s is None else round(round_trip_s * 1000, 1),
        too_slow_for_lease=too_slow,
    )


def device_view(sync: DeviceSync, snapshot: telemetry.Snapshot) -> DeviceView:
    """What health needs of a device now."""
    synced = sync.status.synced
    refused = sync.record.refused
    return DeviceView(
        snapshot,
        sync.controller is not None,
        synced.value,
        synced.version,
        None
        if refused is None
        else {
            "point": refused.point,
            "value": refused.value,
            "reason": refused.reason,
            # When it was written: its age, in status.
            "version": None if refused.version is None else str(refused.version),
        },
        sync.served_by,
        sync.reconciling,
    )


class DeviceViews:
    """Each device's view for health, built again only when something it shows changed.

    Health asks for every device every second and on every change in the store; most
    devices show the same as the time before. What a view shows is read from a few fields
    (the unit's last reading, the sync's status and counters, the record's refusal, the
    bus's record of the unit, whether this instance is active, its lock losses): compared,
    they say whether the view built last still holds, and the same object is handed out
    again, which tells health that its document needs no rebuilding either. Not the
    lease's token: a renewal changes it every third of a TTL, and a device's document does
    not show it (the instance's does); a view's snapshot carries none."""

    def __init__(self) -> None:
        self._built: dict[str, tuple[tuple[object, ...], DeviceView]] = {}

    def views(
        self,
        devices: Mapping[str, DeviceSync],
        snapshot: Callable[[str], telemetry.Snapshot],
        active: bool,
        lock_losses: int,
        bus: Bus | None,
    ) -> dict[str, DeviceView]:
        """Every device's view; `snapshot(device)` its telemetry without the lease's token,
        asked only to build one."""
        for name in [name for name in self._built if name not in devices]:
            del self._built[name]  # no longer configured (a reload)
        views = {}
        for name, sync in devices.items():
            key = _shown(name, sync, active=active, lock_losses=lock_losses, bus=bus)
            built = self._built.get(name)
            if built is None or built[0] != key:
                built = self._built[name] = (key, device_view(sync, snapshot(name)))
            views[name] = built[1]
        return views


def _shown(
    device_id: str,
    sync: DeviceSync,
    *,
    active: bool,
    lock_losses: int,
    bus: Bus | None,
) -> tuple[object, ...]:
    """Everything `device_snapshot` and `device_view` read, as plain values."""
    controller = sync.controller
    status = sync.status
    counters = status.counters
    schedule = bus.schedule if bus is not None and active else None
    return (
        active,
        lock_losses,
        controller is not None,
        controller.last_state if controller is not None and active else None,
        status.controller,
        status.synced,
        status.synced_at,
        counters.invalid_remote_values,
        counters.controller_errors,
        counters.store_errors,
        counters.fenced_writes_rejected,
        counters.not_authorized,
        schedule.slow(device_id) if schedule is not None else None,
        schedule.errors(device_id) if schedule is not None else 0,
        sync.record.refused,
        sync.served_by,
        sync.reconciling,
    )
