"""One agent instance: contends for the device's lock, and while it holds it, keeps the
controller and the store's set point in sync. The standby never opens the serial port."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import random
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, ClassVar

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from agent import logs
from agent.client.errors import StateStoreError
from agent.client.lock import LeasedLock, LossReason, renewal_period_s
from agent.client.session import ConnectionRefused, Session, SessionError
from agent.client.statestore import KeyChange, StateStoreClient
from agent.config import AgentSettings
from agent.controller.base import BlockingPortDriver
from agent.protocol.hlc import Hlc
from agent.runtime import telemetry
from agent.runtime.clock_guard import ClockStepDetector
from agent.runtime.notify import Notifier
from agent.sync.decisions import InvalidRemoteValue, Synced, parse_setpoint
from agent.sync.setpoint import SetpointSync, SyncStatus
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
        self.status = SyncStatus()
        self.state_file = StateFile(settings.state_dir, settings.device_id)
        self.lock_losses = 0
        self.session: Session | None = None
        self.client: StateStoreClient | None = None
        self.lock: LeasedLock | None = None
        self.controller: BlockingPortDriver | None = None
        self.sync: SetpointSync | None = None
        self.scheduler: AsyncIOScheduler | None = None
        self._role_change = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.active_event = asyncio.Event()  # set while active, for tests and --simulate
        self._clock_task: asyncio.Task[None] | None = None
        self._contender: asyncio.Future[Any] | None = None
        self._initial: tuple[bytes | None, Hlc | None] = (None, None)

    # ------------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> int:
        s = self.settings
        logs.set_context(s.device_id, s.instance_id)
        self.status.synced = self.state_file.load()
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
        self.lock = LeasedLock(self.client, s.lock_key, s.instance_id, safety_margin_s=margin)
        self.lock.on_lost(self._on_lock_lost)
        try:
            if not await self._until_stopped(self._subscribe(), stop):
                return await self._shutdown()
            self.role = Role.STANDBY
            # Renewals run from before the first acquisition: a slow takeover (controller
            # open, reconcile) must not outlast the lease it has just taken.
            self._start_scheduler()
            self._clock_task = asyncio.create_task(self._watch_clock(), name="clock")
            await self._contend()
            if self.role is Role.STANDBY:
                self._follow_store(*self._initial)
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
        """Watch the set point and the lock, retrying while the service does not answer."""
        assert self.client is not None and self.lock is not None and self.session is not None
        delay = 0.5
        while True:
            try:
                await self.client.start()
                value, version = await self.client.observe(
                    self.settings.setpoint_key, self._on_setpoint_change
                )
                self._initial = (value, version)
                await self.lock.observe(self._on_lock_change)
                break
            except (StateStoreError, SessionError) as exc:
                log.warning("state store not answering yet: %s", exc)
                await asyncio.sleep(random.uniform(0, delay))
                delay = min(delay * 2, self.settings.mqtt.reconnect_max_s)
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
        if self.sync is not None:
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
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._close_controller()
        if self.client is not None:
            await self.client.close()
        if self.session is not None:
            await self.session.stop()
        return EXIT_OK

    # ------------------------------------------------------------------ roles

    def may_write(self) -> bool:
        return self.role is Role.ACTIVE and self.lock is not None and self.lock.held

    async def _contend(self) -> None:
        if self.role is not Role.STANDBY or self.lock is None:
            return
        try:
            token = await self.lock.try_acquire(self.settings.lock.ttl_ms)
        except (StateStoreError, SessionError) as exc:
            log.debug("lock attempt failed: %s", exc)
            return
        if token is not None:
            await self._become_active(token)

    async def _become_active(self, token: object) -> None:
        async with self._role_change:
            if self.role is not Role.STANDBY:
                return
            self.role = Role.ACTIVE
            assert self.client is not None and self.lock is not None
            self.controller = self._controller_factory(self._on_controller_availability)
            await self.controller.open()
            self.sync = SetpointSync(
                self.controller,
                self.client,
                self.lock,
                self.settings.setpoint_key,
                self.state_file,
                self.status,
                log,
                self.may_write,
            )
            # Reconciled before anything else runs as active: takeover state first.
            await self.sync.reconcile()
            if self.role is not Role.ACTIVE:
                return  # the lease was lost during the takeover; _step_down closes up
            log.info("became active (fencing token %s)", token)
            self.active_event.set()
            self.notifier.status(self._status_words())

    def _on_lock_lost(self, reason: LossReason) -> None:
        self._spawn(self._step_down(reason))

    async def _step_down(self, reason: LossReason) -> None:
        if self.role is not Role.ACTIVE:
            return
        # Writes stop first: may_write() is false from here on.
        self.role = Role.STANDBY
        self.active_event.clear()
        self.lock_losses += 1
        log.warning("stepped down to standby: %s", reason.value)
        async with self._role_change:
            await self._close_controller()
        self.notifier.status(self._status_words())
        await self._contend()

    async def _close_controller(self) -> None:
        self.sync = None
        controller, self.controller = self.controller, None
        if controller is not None:
            await controller.close()

    # ------------------------------------------------------------------ events

    async def _on_setpoint_change(self, change: KeyChange) -> None:
        if self.role is Role.ACTIVE and self.sync is not None:
            await self.sync.on_remote_change(change)
        elif self.role is Role.STANDBY:
            self._follow_store(change.value, change.version)

    def _follow_store(self, value: bytes | None, version: Hlc | None) -> None:
        """While standby: the active keeps controller and store equal, so the store's value
        is the best record of what was synced. On takeover, a controller that differs from
        it holds a local change the former active did not publish (see README)."""
        if value is None or version is None:
            return
        try:
            synced = Synced(parse_setpoint(value), version)
        except InvalidRemoteValue:
            return
        if synced != self.status.synced:
            self.status.synced = synced
            with contextlib.suppress(OSError):
                self.state_file.save(synced)

    def _on_lock_change(self, change: KeyChange) -> None:
        if change.kind == "DELETE" and self.role is Role.STANDBY:
            self._spawn(self._contend())  # released or expired: take over now

    async def _on_reconnect(self) -> None:
        log.info("reconnected to the broker")
        if self.role is Role.ACTIVE and self.sync is not None:
            self._spawn(self.sync.reconcile())
        else:
            self._spawn(self._contend())

    def _on_controller_availability(self, available: bool) -> None:
        if self.role is not Role.ACTIVE:
            return  # a controller being closed on the way out
        if available and self.sync is not None:
            log.info("controller available again: reconciling")
            self._spawn(self.sync.reconcile())
        elif not available:
            log.warning("controller unavailable")
        self.status.controller = "ok" if available else "unavailable"

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
        if self.role is Role.ACTIVE and self.lock is not None:
            try:
                # Bounded by the lease period, so a slow answer cannot stack renewals.
                await self.lock.renew(timeout=renewal_period_s(self.settings.lock.ttl_ms))
            except (StateStoreError, SessionError) as exc:
                log.warning("lock renewal failed: %s", exc)
        elif self.role is Role.STANDBY and (self._contender is None or self._contender.done()):
            # Not awaited: a takeover (controller open, reconcile) must not hold this job,
            # or the renewals of the lease just taken would be skipped (max_instances=1).
            self._contender = self._spawn(self._contend())

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
