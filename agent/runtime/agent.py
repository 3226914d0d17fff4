"""One agent instance: contends for the device's lock, and while it holds it, keeps the
controller and the store's set point in sync. The standby never opens the serial port."""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, ClassVar

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from agent import logs
from agent.client.errors import StateStoreError
from agent.client.lock import (
    LeasedLock,
    LossReason,
    holder_instance,
    process_holder,
    renewal_period_s,
)
from agent.client.session import ConnectionRefused, Session, SessionError
from agent.client.statestore import KeyChange, StateStoreClient
from agent.config import AgentSettings
from agent.controller.base import BlockingPortDriver
from agent.pair.lock_delay import LockDelay
from agent.runtime import telemetry
from agent.runtime.clock_guard import ClockStepDetector
from agent.runtime.notify import Notifier
from agent.sync.setpoint import DeviceKeys, SetpointSync, SyncStatus
from agent.sync.state_file import StateFile

log = logging.getLogger("agent")

EXIT_OK = 0
EXIT_CONFIG = 78  # EX_CONFIG: systemd will not restart (RestartPreventExitStatus=78)


class Role(enum.Enum):
    STARTING = "starting"
    STANDBY = "standby"
    ACTIVE = "active"
    STOPPING = "stopping"


ControllerFactory = Callable[[Callable[[bool], None]], BlockingPortDriver]


def make_controller(settings: AgentSettings, on_availability: Callable[[bool], None]) -> Any:
    serial = settings.serial
    line: dict[str, Any] = {
        "baudrate": serial.baudrate,
        "parity": serial.parity,
        "bytesize": serial.bytesize,
        "stopbits": serial.stopbits,
        "reply_timeout_s": serial.reply_timeout_s,
        "min_write_interval_s": serial.min_write_interval_s,
        "on_availability": on_availability,
    }
    if serial.driver == "modbus":
        from agent.controller.modbus_driver import ModbusController, RegisterMap

        register_map = RegisterMap(
            unit_id=serial.modbus_unit_id,
            setpoint_register=serial.modbus_setpoint_register,
            temperature_register=serial.modbus_temperature_register,
            scale=serial.modbus_scale,
            signed=serial.modbus_signed,
            read_function=serial.modbus_read_function,
            status_function=serial.modbus_read_function,
            write_function=serial.modbus_write_function,
        )
        return ModbusController(serial.url, register_map, **line)
    from agent.controller.serial_driver import SerialController

    return SerialController(serial.url, **line)


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        notifier: Notifier | None = None,
        controller_factory: ControllerFactory | None = None,
    ) -> None:
        self.settings = settings
        self.notifier = notifier or Notifier({})
        self._controller_factory = controller_factory or (
            lambda callback: make_controller(settings, callback)
        )
        self.role = Role.STARTING
        self.holder = process_holder(settings.instance_id).encode()
        self.lock_losses = 0
        self.session: Session | None = None
        self.client: StateStoreClient | None = None
        self.lock: LeasedLock | None = None
        self.controller: BlockingPortDriver | None = None
        self.sync: SetpointSync | None = None
        self.scheduler: AsyncIOScheduler | None = None
        self.lock_delay = LockDelay.starting(settings.lock.ttl_ms / 1000, time.monotonic())
        self._active_epoch: int | None = None
        self._role_change = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._renewals: set[asyncio.Future[Any]] = set()
        self.active_event = asyncio.Event()  # set while active, for tests and --simulate
        self._clock_task: asyncio.Task[None] | None = None
        self._contender: asyncio.Future[Any] | None = None
        self._duplicates_reported: set[bytes] = set()

    @property
    def status(self) -> SyncStatus:
        assert self.sync is not None
        return self.sync.status

    # ------------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> int:
        s = self.settings
        logs.set_context(s.device_id, s.instance_id)
        self.notifier.status("connecting to the broker")
        self.session = Session(s.mqtt, client_id=s.client_id)
        try:
            if not await self._until_stopped(self.session.start(wait=True), stop):
                await self.session.stop()
                return EXIT_OK
        except ConnectionRefused as exc:
            log.error("the broker refused the connection: %s", exc)
            return EXIT_CONFIG
        self.client = StateStoreClient(self.session, request_timeout_s=s.mqtt.request_timeout_s)
        margin = None if s.lock.safety_margin_ms is None else s.lock.safety_margin_ms / 1000
        self.lock = LeasedLock(self.client, s.lock_key, self.holder, safety_margin_s=margin)
        self.lock.on_lost(self._on_lock_lost)
        self.sync = SetpointSync(
            self.client,
            self.lock,
            DeviceKeys(s.setpoint_key, s.record_key),
            StateFile(s.state_dir, s.device_id),
            log,
            self.may_write,
        )
        try:
            if not await self._until_stopped(self._subscribe(), stop):
                return await self._shutdown()
            self.role = Role.STANDBY
            # Renewals run from before the first acquisition: a slow takeover (waiting for
            # the previous lease, controller open, reconcile) must not outlast the lease.
            self._start_scheduler()
            self._clock_task = asyncio.create_task(self._watch_clock(), name="clock")
            await self._contend()
            self.notifier.ready(self._status_words())
            log.info("started as %s", self.role.value)
            self._add_periodic_jobs()
            if self.notifier.watchdog_interval_s:
                self._spawn(self._watchdog(self.notifier.watchdog_interval_s))
            await stop.wait()
        finally:
            code = await self._shutdown()
        return code

    async def _until_stopped(self, work: Awaitable[Any], stop: asyncio.Event) -> bool:
        """Runs `work` unless `stop` comes first; False if stopped."""
        task = asyncio.ensure_future(work)
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return False
        task.result()
        return True

    async def _subscribe(self) -> None:
        """Watch the set point, the sync record and the lock, retrying while the service
        does not answer."""
        assert self.client is not None and self.lock is not None and self.session is not None
        assert self.sync is not None
        s = self.settings
        delay = 0.5
        while True:
            try:
                await self.client.start()
                # The lock before the record: see _store_kept_its_contents.
                holder = await self.lock.observe(self._on_lock_change)
                self._saw_holder(holder)
                value, version = await self.client.observe(s.setpoint_key, self._on_setpoint_change)
                self.sync.follow_setpoint(value, version)
                record, _ = await self.client.observe(s.record_key, self._on_record_change)
                await self.sync.follow_record(record)
                if holder is None and record is not None:
                    self._store_kept_its_contents()
                break
            except (StateStoreError, SessionError) as exc:
                log.warning("state store not answering yet: %s", exc)
                await asyncio.sleep(random.uniform(0, delay))
                delay = min(delay * 2, s.mqtt.reconnect_max_s)
        self.session.on_connect(self._on_reconnect)

    async def _shutdown(self) -> int:
        """SIGTERM: stop writing, release the lock so the standby takes over, exit 0."""
        was_active = self.role is Role.ACTIVE
        self.role = Role.STOPPING
        self.active_event.clear()
        self.notifier.stopping("stopping")
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
        if self._clock_task is not None:
            self._clock_task.cancel()
        if self.sync is not None and self.sync.controller is not None:
            # A write already on the line finishes before the lock goes, so it cannot
            # overlap the next active's; nothing new starts (may_write() is false).
            await self.sync.quiesce(timeout=5)
        # Released before the port is closed: closing can take a while (pyserial's close
        # of a socket:// port sleeps), and the standby should not wait for it.
        if was_active and self.lock is not None and self.lock.token is not None:
            try:
                await self.lock.release(timeout=2)
                log.info("released the lock")
            except (StateStoreError, SessionError) as exc:
                log.warning("could not release the lock (it expires by itself): %s", exc)
        for task in [*self._tasks, *self._renewals]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._renewals, return_exceptions=True)
        await self._close_controller()
        if self.client is not None:
            await self.client.close()
        if self.session is not None:
            await self.session.stop()
        return EXIT_OK

    # ------------------------------------------------------------------ roles

    def may_write(self) -> bool:
        """Active, within the lease that made it active: writes to the controller and the
        store are allowed only then."""
        return (
            self.role is Role.ACTIVE
            and self.lock is not None
            and self.lock.held
            and self.lock.confirmed
            and self.lock.epoch == self._active_epoch
        )

    async def _contend(self) -> None:
        if self.role is not Role.STANDBY or self.lock is None or self.lock.held:
            return
        try:
            token = await self.lock.try_acquire(self.settings.lock.ttl_ms)
        except (StateStoreError, SessionError) as exc:
            log.debug("lock attempt failed: %s", exc)
            return
        if token is None:
            self.lock_delay.seen_held(time.monotonic())  # someone else holds it
            return
        await self._take_over(self.lock.epoch, token)

    async def _take_over(self, epoch: int, token: object) -> None:
        """Drives the line under the lease of `epoch`, once the previous lease has ended."""
        assert self.lock is not None and self.session is not None and self.sync is not None
        lock = self.lock
        # Reconnect fast while the lease is held: a slow reconnect would cost the lease.
        self.session.set_reconnect_ceiling(max(0.05, self.settings.lock.ttl_ms / 12_000))
        async with self._role_change:
            wait = self.lock_delay.wait_s(time.monotonic())
            if wait > 0:
                log.info("holding the lock; waiting %.1f s for the previous lease to end", wait)
                await asyncio.sleep(wait)
            if self.role is not Role.STANDBY or not lock.held or lock.epoch != epoch:
                return  # lost meanwhile: the loss handler stepped down already
            self.role = Role.ACTIVE
            self._active_epoch = epoch
            self.controller = self._controller_factory(self._on_controller_availability)
            await self.controller.open()
            # Reconciled before anything else runs as active: takeover state first.
            await self.sync.take_over(self.controller)
            if not self.may_write():
                return  # the lease was lost during the takeover; _step_down closes up
            log.info("became active (fencing token %s)", token)
            self.active_event.set()
            self.notifier.status(self._status_words())

    def _on_lock_lost(self, reason: LossReason) -> None:
        self._spawn(self._step_down(reason.value))

    async def _step_down(self, reason: str) -> None:
        if self.session is not None and (self.lock is None or not self.lock.held):
            self.session.set_reconnect_ceiling(None)
        if self.role is not Role.ACTIVE:
            return
        # Writes stop first: may_write() is false from here on.
        self.role = Role.STANDBY
        self._active_epoch = None
        self.active_event.clear()
        self.lock_losses += 1
        log.warning("stepped down to standby: %s", reason)
        async with self._role_change:
            await self._close_controller()
        self.notifier.status(self._status_words())
        await self._contend()

    async def _close_controller(self) -> None:
        controller = self.sync.release() if self.sync is not None else None
        self.controller = None
        if controller is not None:
            await controller.close()

    # ------------------------------------------------------------------ events

    async def _on_setpoint_change(self, change: KeyChange) -> None:
        assert self.sync is not None
        if self.role is Role.ACTIVE and self.sync.controller is not None:
            await self.sync.on_remote_change(change)
        elif self.role is not Role.ACTIVE:
            self.sync.follow_setpoint(change.value, change.version)

    async def _on_record_change(self, change: KeyChange) -> None:
        if self.role is not Role.ACTIVE and self.sync is not None:
            await self.sync.follow_record(change.value)

    def _on_lock_change(self, change: KeyChange) -> None:
        now = time.monotonic()
        if change.kind == "SET":
            self._saw_holder(change.value)
        elif not change.synthetic:
            # A live DELETE: released, or expired at the store. The holder stopped first.
            self.lock_delay.seen_released(now)
            if self.role is Role.STANDBY:
                self._spawn(self._contend())  # take over now

    def _saw_holder(self, holder: bytes | None) -> None:
        if holder is None or holder == self.holder:
            return
        self.lock_delay.seen_held(time.monotonic())
        duplicate = holder_instance(holder) == self.settings.instance_id
        if duplicate and holder not in self._duplicates_reported:
            self._duplicates_reported.add(holder)
            log.error(
                "another process with instance id %s holds the lock %s (%s): instance "
                "ids must be unique within a pair (a cloned gateway? set "
                "AGENT_INSTANCE_ID)",
                self.settings.instance_id,
                self.settings.lock_key,
                holder.decode(errors="replace"),
            )

    def _store_kept_its_contents(self) -> None:
        """The lock was absent, and a sync record read after it was there.

        Every active writes its records only under the lock delay, so a record that
        survived proves the store did not forget its contents since the last lease could
        have been granted: the lock's absence then means that lease expired or was
        released. No need to wait a TTL (at start, after a link outage) in that case.
        """
        self.lock_delay.seen_released(time.monotonic())

    async def _on_reconnect(self) -> None:
        log.info("reconnected to the broker")
        # What happened at the store while the link was down is unknown.
        self.lock_delay.lost_sight(time.monotonic())
        if self.role is Role.ACTIVE and self.sync is not None:
            self._spawn(self._confirm_then_reconcile())
        else:
            self._spawn(self._look_and_contend())

    async def _confirm_then_reconcile(self) -> None:
        """Back on the link as active: nothing is written until a renewal confirms that the
        store still holds our lease (it may have restarted without it), then the three are
        compared for what changed meanwhile."""
        assert self.lock is not None and self.sync is not None
        self.lock.doubt()
        await self._renew(self._renewal_timeout())
        if self.lock.confirmed and self.may_write():
            await self.sync.reconcile()

    async def _look_and_contend(self) -> None:
        assert self.client is not None and self.lock is not None
        try:
            holder = await self.lock.current_holder()
            self._saw_holder(holder)
            if holder is None:
                record, _ = await self.client.get(self.settings.record_key)
                if record is not None:
                    self._store_kept_its_contents()
        except (StateStoreError, SessionError) as exc:
            log.debug("could not look at the lock after reconnecting: %s", exc)
        await self._contend()

    def _on_controller_availability(self, available: bool) -> None:
        if self.role is not Role.ACTIVE or self.sync is None or self.sync.controller is None:
            return  # a controller being opened by a takeover, or closed on the way out
        if available:
            log.info("controller available again: reconciling")
            self._spawn(self.sync.reconcile())
        else:
            log.warning("controller unavailable")
        self.sync.status.controller = "ok" if available else "unavailable"

    # ------------------------------------------------------------------ periodic jobs

    _JOB_OPTIONS: ClassVar[dict[str, Any]] = {
        "coalesce": True,
        "max_instances": 1,
        "misfire_grace_time": 5,
    }

    def _start_scheduler(self) -> None:
        """The scheduler with the lease job only; the others come once the role is decided."""
        self.scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop())
        lease_period = renewal_period_s(self.settings.lock.ttl_ms)
        self.scheduler.add_job(
            self._lease_job, IntervalTrigger(seconds=lease_period), id="lease", **self._JOB_OPTIONS
        )
        self.scheduler.start()

    def _add_periodic_jobs(self) -> None:
        s = self.settings
        assert self.scheduler is not None
        common = self._JOB_OPTIONS
        self.scheduler.add_job(
            self._poll_job, IntervalTrigger(seconds=s.serial.poll_interval_s), id="poll", **common
        )
        self.scheduler.add_job(
            self._reconcile_job,
            IntervalTrigger(seconds=s.reconcile_interval_s),
            id="reconcile",
            **common,
        )
        self.scheduler.add_job(
            self._telemetry_job,
            IntervalTrigger(seconds=s.telemetry.interval_s, jitter=s.telemetry.jitter_s or None),
            id="telemetry",
            next_run_time=datetime.now().astimezone(),
            **common,
        )

    async def _lease_job(self) -> None:
        lock = self.lock
        if lock is None:
            return
        if lock.held:
            # Not awaited, and bounded by the lease itself: renewals may overlap, so that a
            # slow link does not skip renewals the store would have granted.
            renewal = asyncio.ensure_future(self._renew(self._renewal_timeout()))
            self._renewals.add(renewal)
            renewal.add_done_callback(self._renewals.discard)
        elif self.role is Role.ACTIVE:
            # An active without a lease is a bug: whatever led here, stop driving.
            await self._step_down("active without a lease")
        elif self.role is Role.STANDBY and (self._contender is None or self._contender.done()):
            # Not awaited: a takeover (controller open, reconcile) must not hold this job.
            self._contender = self._spawn(self._contend())

    def _renewal_timeout(self) -> float:
        """A renewal is worth waiting for until the lease would end anyway."""
        deadline = self.lock.deadline if self.lock is not None else None
        return 0.05 if deadline is None else max(0.05, deadline - time.monotonic())

    async def _renew(self, timeout: float) -> None:
        assert self.lock is not None
        try:
            await self.lock.renew(timeout=timeout)
        except (StateStoreError, SessionError) as exc:
            log.warning("lock renewal failed: %s", exc)

    async def _poll_job(self) -> None:
        if self.role is Role.ACTIVE and self.sync is not None:
            await self.sync.poll()

    async def _reconcile_job(self) -> None:
        if self.role is Role.ACTIVE and self.sync is not None:
            await self.sync.reconcile()

    async def _telemetry_job(self) -> None:
        if self.session is None or not self.session.connected:
            return
        payload, properties = telemetry.build(self.snapshot())
        interval = self.settings.telemetry.interval_s
        try:
            await self.session.publish(
                self.settings.telemetry_topic,
                payload,
                qos=1,
                content_type=telemetry.CONTENT_TYPE,
                message_expiry_interval=max(1, math.ceil(interval * 3)),
                user_properties=properties,
                timeout=max(1.0, interval),
            )
        except SessionError as exc:
            log.debug("telemetry not published: %s", exc)

    def snapshot(self) -> telemetry.Snapshot:
        active = self.role is Role.ACTIVE
        state = self.controller.last_state if active and self.controller is not None else None
        counters = self.status.counters
        synced = self.status.synced
        token = self.lock.token if self.lock is not None and active else None
        return telemetry.Snapshot(
            device=self.settings.device_id,
            instance=self.settings.instance_id,
            role="active" if active else "standby",
            setpoint=state.setpoint if state else None,
            temperature=state.temperature if state else None,
            output=state.output if state else None,
            mode=state.mode.value if state and state.mode else None,
            controller=self.status.controller if active else None,
            fencing_token=str(token) if token else None,
            last_sync_time=telemetry.iso_time(self.status.synced_at),
            last_sync_version=str(synced.version) if synced.version else None,
            errors={
                "invalid_remote_values": counters.invalid_remote_values,
                "controller_errors": counters.controller_errors,
                "store_errors": counters.store_errors,
                "fenced_writes_rejected": counters.fenced_writes_rejected,
                "lock_losses": self.lock_losses,
            },
        )

    # ------------------------------------------------------------------ health

    async def _watch_clock(self) -> None:
        detector = ClockStepDetector()
        while True:
            await asyncio.sleep(0.5)
            step = detector.check()
            if step is not None and self.scheduler is not None:
                log.warning("wall clock stepped by %+.1f s: rescheduling jobs", step)
                now = datetime.now().astimezone()
                for job in self.scheduler.get_jobs():
                    job.modify(next_run_time=now)
                self.scheduler.wakeup()

    def healthy(self) -> bool:
        if self.session is None or self.session.error is not None:
            return False
        if self.scheduler is None or not self.scheduler.running:
            return False
        return self._clock_task is not None and not self._clock_task.done()

    async def _watchdog(self, interval: float) -> None:
        # Runs on the event loop: a stalled loop stops the pings by itself.
        while True:
            if self.healthy():
                self.notifier.watchdog()
            await asyncio.sleep(interval)

    def _status_words(self) -> str:
        return f"{self.role.value} for {self.settings.device_id}"

    def _spawn(self, work: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)
        return task


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task failed", exc_info=task.exception())
