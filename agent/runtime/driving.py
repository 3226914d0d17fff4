"""The line as the active drives it: opened at a takeover (and on resume), each device
reconciled in order of need and served as soon as it is, closed at a step-down, a pause or
the end. Every transaction on it passes the lease's gate (agent.controller.driver)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agent.controller.driver import Driver
from agent.controller.interface import ControllerState
from agent.line.bus import Bus, transaction_tally
from agent.runtime.line import make_units, write_intervals
from agent.sync.device import DeviceSync
from agent.tally import Tally

if TYPE_CHECKING:
    from agent.config import AgentSettings

log = logging.getLogger("agent")


class ActiveLine:
    def __init__(
        self,
        settings: AgentSettings,
        driver: Driver,
        devices: dict[str, DeviceSync],
        *,
        may_write: Callable[[], bool],
        deadline: Callable[[], float | None],
        spawn: Callable[[Awaitable[Any]], asyncio.Future[Any]],
        bus_stopped: Callable[[], None] = lambda: None,
    ) -> None:
        """`may_write()`: this instance drives the line now (active, within its lease, not
        paused); `deadline()`: its lease's local deadline (monotonic), or None;
        `bus_stopped()`: the bus's thread ended by a fault of its own (the agent exits, for
        systemd to start it again, and the standby takes over meanwhile)."""
        self.settings = settings
        self.driver = driver
        self.devices = devices
        self.may_write = may_write
        self.deadline = deadline
        self._spawn = spawn
        self._bus_stopped = bus_stopped
        self.bus: Bus | None = None
        self.transactions = transaction_tally()
        """Every bus's transactions, this process's whole life (agent.runtime.metrics)."""
        self.line_events = Tally()
        self.lock = asyncio.Lock()
        """The line opened, closed, paused: one at a time."""
        self._reconciling: asyncio.Future[Any] | None = None

    async def open(self) -> None:
        """Opens the line; each device is then fenced in the store and reconciled by its
        own worker as soon as its fence is done, and served as soon as it is reconciled.
        Returns once the line is driven, before any device is fenced: a line of 32 whole
        thermostats (256 keys to fence) is active within the bound, whatever its length."""
        # Shown (self.bus) once open: a line still opening is not a line down.
        bus = Bus(
            self.driver,
            [unit for unit in make_units(self.settings) if unit.name in self.devices],
            poll_interval_s=self.settings.serial.poll_interval_s,
            min_write_interval_s=write_intervals(self.settings),
            probe_initial_s=self.settings.serial.probe_interval_s,
            probe_max_s=10 * self.settings.serial.probe_interval_s,
            on_reading=self._on_reading,
            reading_wanted=self._reading_wanted,
            on_availability=self._on_availability,
            on_stopped=self._bus_stopped,
            gate=self.gate,
            driving=self.may_write,
            transactions=self.transactions,
            line_events=self.line_events,
        )
        await bus.open()
        self.bus = bus
        self._reconciling = self._spawn(self._take_over_devices(bus, time.monotonic()))

    async def _take_over_devices(self, bus: Bus, started: float) -> None:
        async def take_over(name: str, sync: DeviceSync) -> bool:
            needs = await sync.take_over(bus.device(name))
            if self.bus is bus:
                log.debug("device %s fenced: reconciling it", name)
                sync.start()
            return needs

        needs = await asyncio.gather(
            *(take_over(name, sync) for name, sync in self.devices.items())
        )
        first = sum(needs)
        await asyncio.gather(*(sync.wait_reconciled() for sync in self.devices.values()))
        log.info(
            "line open: %d device(s) reconciled in %.0f ms (%d with a remote change the former "
            "active never applied)",
            len(self.devices),
            (time.monotonic() - started) * 1000,
            first,
        )

    async def recheck_claims(self) -> None:
        """While active, every reconcile interval: a device left to another line is taken
        back once that line no longer serves it; a device another line named itself for
        meanwhile (both took over at once) is left to it."""
        bus = self.bus
        if bus is None or (self._reconciling is not None and not self._reconciling.done()):
            return  # the takeover's own fences are still going on
        for name, sync in list(self.devices.items()):
            left = sync.served_by is not None
            if await sync.check_served_elsewhere() or not left or self.bus is not bus:
                continue
            await sync.take_over(bus.device(name))
            sync.start()

    async def close(self) -> None:
        """Hands every device's controller back (pending work is dropped: the next active
        reconciles) and closes the line once the transaction on it has ended."""
        if self._reconciling is not None:
            self._reconciling.cancel()
            self._reconciling = None
        for sync in self.devices.values():
            sync.release()
        bus, self.bus = self.bus, None
        if bus is not None:
            await bus.close()

    def gate(self, lasts_s: float) -> bool:
        """On the bus's thread, right before a transaction's first byte: this instance
        drives the line, and its lease lasts until the transaction (`lasts_s` long at
        most) has ended."""
        if not self.may_write():
            return False
        deadline = self.deadline()
        return deadline is not None and time.monotonic() + lasts_s <= deadline

    def _reading_wanted(self, device_id: str, state: ControllerState) -> bool:
        """On the bus's thread: a routine reading is news only if it differs from what
        was last synced (most do not, and cost the event loop nothing). A device a reload
        took off the line while its transaction ran has no news."""
        sync = self.devices.get(device_id)
        return sync is not None and sync.wants(state)

    def _on_reading(self, device_id: str, state: ControllerState, at: float) -> None:
        sync = self.devices.get(device_id)
        if sync is not None:  # else taken off the line by a reload meanwhile
            sync.polled(state, at)

    def _on_availability(self, device_id: str, available: bool) -> None:
        sync = self.devices.get(device_id)
        if sync is None or sync.controller is None:
            return  # the line being opened by a takeover, or closed on the way out
        if available:
            sync.reconcile_soon()
        else:
            sync.left_line()
        sync.status.controller = "ok" if available else "unavailable"
