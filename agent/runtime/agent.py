"""One agent instance for one serial line: contends for the line's lock and, while it holds
it, drives the line and keeps every device's controller and set point in sync. The
standby never opens the port; it follows the store, ready to take over."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agent import logs
from agent.client.errors import NotAuthorized, StateStoreError
from agent.client.lock import process_nonce
from agent.client.session import ConnectionRefused, Session, SessionError, TlsSetupFailed
from agent.client.statestore import KeyChange, StateStoreClient
from agent.config import as_running, variable_name
from agent.config.fingerprint import config_hash
from agent.controller.driver import Driver, PortClaim, PortTaken
from agent.line.bus import Bus
from agent.ops.control import SwitchoverRequest
from agent.pair.leadership import Leadership, Role
from agent.runtime import jobs, reload, telemetry
from agent.runtime.clock_watch import watch_clock
from agent.runtime.control import LineControl
from agent.runtime.devices import make_sync, store_retry, watch_device, watch_devices
from agent.runtime.driving import ActiveLine
from agent.runtime.exits import EXIT_CONFIG, EXIT_OK, EXIT_SOFTWARE
from agent.runtime.health import Health, InstanceView
from agent.runtime.health_http import HealthEndpoint, UnusableSetting, open_endpoint
from agent.runtime.line import make_driver, warn_about
from agent.runtime.line_history import LineHistory
from agent.runtime.metrics import Metrics
from agent.runtime.notify import Notifier
from agent.runtime.readiness import Readiness
from agent.runtime.reloading import ReloadVerdicts, runtime_directory
from agent.runtime.reports import DeviceViews, LineRate, device_snapshot, line_snapshot
from agent.sync.device import DeviceSync
from agent.sync.state_file import LaterSaves

if TYPE_CHECKING:
    from agent.config import AgentSettings

log = logging.getLogger("agent")

READY_WAIT_S = 5.0
"""At start as active, how long readiness waits for the devices to be reconciled."""

DriverFactory = Callable[["AgentSettings"], Driver]


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        notifier: Notifier | None = None,
        driver_factory: DriverFactory = make_driver,
    ) -> None:
        # Plain values from here on (agent.config.running): the same whether the settings
        # came validated from another process or as a model.
        self.settings = settings = as_running(settings)
        self.line = settings.line
        self.notifier = notifier or Notifier({})
        self.process = process_nonce()  # this process among all: in the lock, client id, health
        self._driver_factory = driver_factory
        self.session: Session | None = None
        self.client: StateStoreClient | None = None
        self.leadership: Leadership | None = None
        self.devices: dict[str, DeviceSync] = {}
        self.active_line: ActiveLine | None = None
        self._jobs: list[asyncio.Task[None]] = []  # the periodic ones (agent.runtime.jobs)
        self._claim: PortClaim | None = None
        self._driver: Driver | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._clock_task: asyncio.Task[None] | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self._line_rate = LineRate()
        self._device_views = DeviceViews()
        self.later_saves = LaterSaves()
        self._devices_watched = asyncio.Event()  # every device's keys watched (or left out)
        self._lock_absent_at: float | None = None  # the read that found no lock at start, sent
        self._ended = asyncio.Event()
        self._exit_code: int | None = None
        self.control: LineControl | None = None  # pause and switchover (agent.runtime.control)
        self.health = Health(
            settings, self.view, lambda: self.session, self.notifier.status, self.process
        )
        self._endpoint: HealthEndpoint | None = None
        self.config_hash = config_hash(settings)
        self._reloading = asyncio.Lock()
        self.reloads = ReloadVerdicts(runtime_directory())
        self.readiness = Readiness(settings.serial.url, self.line.id, settings.instance_id)
        leased = lambda: self.leadership is not None and self.leadership.may_drive()  # noqa: E731
        clients = (lambda: self.client, lambda: self.control)
        self.history = LineHistory(settings, self.process, *clients, self._spawn, leased)

    # ------------------------------------------------------------------ state

    @property
    def role(self) -> Role:
        return self.leadership.role if self.leadership is not None else Role.STARTING

    @property
    def client_id(self) -> str:
        """The derived client id names this process too: two gateways cloned from one image
        must not take each other's sessions over. A configured one is used as it is."""
        s = self.settings
        return s.client_id if s.mqtt.client_id else f"{s.client_id}-{self.process}"

    def _log_fields(self) -> dict[str, str | None]:
        token = self.leadership.token if self.leadership is not None else None
        return {"role": self.role.value, "token": None if token is None else str(token)}

    @property
    def paused(self) -> bool:
        return self.control is not None and self.control.paused

    def names(self) -> tuple[str, str]:
        return self.line.id, self.settings.instance_id

    def may_write(self) -> bool:
        return self.leadership is not None and self.leadership.may_drive() and not self.paused

    # ------------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> int:
        s = self.settings
        logs.set_context(line=self.line.id, instance=s.instance_id)
        logs.set_live_fields(self._log_fields)
        try:
            self._claim = PortClaim.of(s.serial.url, s.serial.lock_dir)
        except PortTaken as exc:
            log.error("invalid setting AGENT_SERIAL__URL (serial.url): %s", exc)
            return EXIT_CONFIG
        try:
            # Made once, at start: a setting the driver cannot use is a configuration error
            # now, not at the first takeover, and a takeover does not wait for it.
            self._driver = self._driver_factory(s)
        except ValueError as exc:
            log.error("invalid setting AGENT_SERIAL (serial): %s", exc)
            return EXIT_CONFIG
        warn_about(s, self._driver)
        # Before the broker: a port it cannot listen on is said at start, not after a wait.
        if not await self._start_endpoint():
            return EXIT_CONFIG
        # Ready as soon as it runs: a start never waits on the broker (systemctl start would
        # hang for TimeoutStartSec); the status line says what it waits for and what fails.
        self._spawn(self.health.run())
        self.notifier.ready(self.health.words())
        if self.notifier.watchdog_interval_s:
            self._spawn(self._watchdog(self.notifier.watchdog_interval_s))
        try:
            # Its errors name the settings to check as the agent's are set: variables.
            self.session = Session(
                s.mqtt, client_id=self.client_id, will=self.health.will(), names=variable_name
            )
            # An instance of a pair is back on the store within a TTL of it being
            # reachable, whatever happened before (see agent.pair.leadership).
            self.session.set_reconnect_ceiling(s.lock.ttl_ms / 1000)
        except TlsSetupFailed as exc:  # a CA that is not PEM, a wrong key password, ...
            log.error("invalid setting AGENT_MQTT__TLS (mqtt.tls): %s", exc)
            return EXIT_CONFIG
        try:
            if not await self._until_stopped(self.session.start(wait=True), stop):
                return await self._shutdown()
        except ConnectionRefused as exc:
            log.error("the broker refused the connection: %s", exc)
            await self._shutdown()
            return EXIT_CONFIG
        self.client = StateStoreClient(self.session, request_timeout_s=s.mqtt.request_timeout_s)
        margin = None if s.lock.safety_margin_ms is None else s.lock.safety_margin_ms / 1000
        self.leadership = Leadership(
            self.session,
            self.client,
            lock_key=s.lock_key,
            instance_id=s.instance_id,
            ttl_ms=s.lock.ttl_ms,
            safety_margin_s=margin,
            take_over=self._take_over_line,
            step_down=self._step_down_line,
            spawn=self._spawn,
            process=self.process,
        )
        self.control = LineControl(
            self.client,
            paused_key=s.keys.of_line("paused", self.line.id),
            switchover_key=s.keys.of_line("switchover", self.line.id),
            instance_id=s.instance_id,
            holder=self.leadership.holder,
            grace_s=s.lock.ttl_ms / 1000,
            on_pause=lambda: self._spawn(self._follow_pause()),
            on_switchover=self._on_switchover,
        )
        self.leadership.hold_off = self.control.hold_off
        self.leadership.on_waiting(self.health.poke)
        lock = self.leadership.lock
        self.active_line = ActiveLine(
            s,
            self._driver,
            self.devices,
            may_write=self.may_write,
            deadline=lambda: lock.deadline,
            spawn=self._spawn,
            bus_stopped=lambda: self._end(EXIT_SOFTWARE),
        )
        assert self._driver is not None
        self.leadership.must_cover(self._driver.longest_transaction_s)
        self.leadership.look_before_contending = self._look_at_the_lock
        # What each device's sync knows of the store comes from watching its keys, and a
        # record among them may end the lock delay: a takeover starts once they are.
        self.leadership.ready_to_take_over = self._devices_watched.wait
        self.leadership.on_lock_seen = self.history.saw_lock
        for device in self.line.devices:
            self.devices[device.id] = make_sync(
                s, device, self.client, self.leadership.lock, self.may_write, self.later_saves
            )
        try:
            if not await self._until_stopped(self._subscribe(), stop):
                return await self._shutdown()
            self._spawn(self._watch_devices())
            self.leadership.standing_by()
            # Renewals run from before the first acquisition: a slow takeover (waiting for
            # the previous lease, opening the line, reconciling) must not outlast the lease.
            self._lease_task = asyncio.create_task(self.leadership.run_lease(), name="lease")
            clock = watch_clock(lambda: self.role is Role.ACTIVE, self.settings.lock.ttl_ms)
            self._clock_task = asyncio.create_task(clock, name="clock")
            self._spawn(self.readiness.run(lambda: self.role is Role.ACTIVE, self.health.poke))
            await self.leadership.contend()
            if self.role is Role.ACTIVE:
                # Ready with the devices' state in its words, once they are reconciled.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(READY_WAIT_S):
                        await asyncio.gather(*(d.wait_reconciled() for d in self.devices.values()))
            self.health.poke()
            log.info("started as %s", self.role.value)
            self._add_periodic_jobs()
            await self._until_stopped(self._ended.wait(), stop)
        finally:
            code = await self._shutdown()
        return self._exit_code if self._exit_code is not None else code

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
        """Watch the lock and the control keys, retrying while the service does not answer;
        the devices' keys follow (_watch_devices). Over a slow link a start is counted in
        round trips: the subscriptions go out together, then the lock and the control keys
        together (a KEYNOTIFY each, then a GET each), then the contention, so that this
        instance is a standby in a few round trips whatever the size of its line."""
        assert self.client is not None and self.session is not None
        assert self.leadership is not None and self.control is not None
        retry = store_retry(self.settings.mqtt)
        while True:
            try:
                # Another process with this instance id says so on the health topic.
                await asyncio.gather(
                    self.client.start(),
                    self.session.subscribe(self.health.topic, self.health.heard),
                )
                asked_at = time.monotonic()
                # The lock before the records: see Leadership.store_kept_its_contents.
                holder, _ = await asyncio.gather(self.leadership.watch(), self.control.watch())
                self._lock_absent_at = asked_at if holder is None else None
                break
            except NotAuthorized as exc:
                log.error(
                    "the store refuses to let this agent use the lock %s (not authorized by "
                    "the broker's rules): nothing can be served; retrying (%s)",
                    self.settings.lock_key,
                    exc,
                )
                await retry.sleep()
            except (StateStoreError, SessionError) as exc:
                # Within a TTL, as a reconnect: a start cut by outages is no standby until
                # it gets here, and its peer may be the only instance left.
                delay = retry.next_delay(ceiling=self.leadership.idle_reconnect_s)
                log.warning("state store not answering yet: %s; trying again in %.2f s", exc, delay)
                await asyncio.sleep(delay)
        self.session.on_connect(self._on_reconnect)

    async def _watch_devices(self) -> None:
        """Every device's keys, watched while the start goes on. A takeover waits for them;
        a line none of whose devices can be served ends the process."""
        assert self.leadership is not None
        leadership, absent_at = self.leadership, self._lock_absent_at

        def record_found() -> None:
            if absent_at is not None:
                leadership.store_kept_its_contents(lock_absent_at=absent_at)

        try:
            await watch_devices(
                self.devices,
                self._watch_device,
                retry=store_retry(self.settings.mqtt),
                within_s=leadership.idle_reconnect_s,
                record_found=record_found,
                session=self.session,
            )
        finally:
            self._devices_watched.set()
        if not self.devices:
            log.error("no device of line %s can be served: nothing to do", self.line.id)
            self._end(EXIT_CONFIG)

    def _end(self, code: int) -> None:
        self._exit_code = code
        self._ended.set()

    async def _watch_device(self, device_id: str, sync: DeviceSync) -> tuple[bool, bytes | None]:
        """Watches a device's keys (agent.runtime.devices): whether it may be, its record."""
        assert self.client is not None
        sync.note = self.history.device_event  # a unit back, a refusal: in the line's history
        return await watch_device(
            self.client,
            device_id,
            sync,
            on_point=self._on_point,
            on_record=self._on_record,
            store_seen=self.health.store_seen,
        )

    async def _shutdown(self) -> int:
        """SIGTERM: stop writing, release the lock so the standby takes over, exit 0."""
        self.notifier.stopping("stopping")
        was_active = await self.leadership.stop() if self.leadership is not None else False
        for job in self._jobs:
            job.cancel()
        if self._clock_task is not None:
            self._clock_task.cancel()
        if self._lease_task is not None:
            self._lease_task.cancel()
        # A write already on the line finishes before the lock goes, so it cannot overlap
        # the next active's; nothing new starts (may_write() is false).
        await asyncio.gather(*(sync.quiesce(timeout=5) for sync in self.devices.values()))
        for sync in self.devices.values():
            await sync.stop()
        await self.later_saves.close()
        # Released before the line is closed: closing can take a while (pyserial's close
        # of a socket:// port sleeps), and the standby should not wait for it.
        if was_active and self.leadership is not None:
            await self.health.going_offline()
            await self.leadership.release()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.health.stopped()
        if self._endpoint is not None:
            await self._endpoint.close()
        await self._close_line()
        if self.client is not None:
            await self.client.close()
        if self.session is not None:
            await self.session.stop()
        if self._claim is not None:
            self._claim.release()
        return EXIT_OK

    # ------------------------------------------------------------------ driving the line

    async def _take_over_line(self) -> None:
        """Opens the line as the new active (its devices reconciled as it goes); a paused
        line stays closed until it is resumed."""
        assert self.active_line is not None and self.leadership is not None
        self.history.took_over(self.leadership.lock.token)
        async with self.active_line.lock:
            if self.control is not None and self.control.paused:
                log.info("the line is paused: it stays closed until resumed")
            else:
                await self.active_line.open()
        self._role_changed()

    @property
    def bus(self) -> Bus | None:
        return self.active_line.bus if self.active_line is not None else None

    async def _close_line(self) -> None:
        if self.active_line is not None:
            await self.active_line.close()

    async def _step_down_line(self, reason: str) -> None:
        assert self.active_line is not None
        self.history.stepped_down(reason)
        async with self.active_line.lock:
            await self._close_line()
        self._role_changed()

    def _role_changed(self) -> None:
        self.health.poke()

    # ------------------------------------------------------------------ operator requests

    async def _follow_pause(self) -> None:
        """Paused: the line closed (a transaction on it finishes first), the lock kept.
        Resumed: the active opens the line and reconciles every device."""
        assert self.control is not None and self.active_line is not None
        async with self.active_line.lock:
            pause = self.control.pause
            if pause is not None:
                closing = "the line is closed" if self.bus is not None else "the line stays closed"
                log.info("line paused (%s): %s, nothing is written", pause.describe(), closing)
                await self._close_line()
                self.history.paused(self.leadership and self.leadership.token, pause)
            elif self.role is Role.ACTIVE and self.bus is None and self.may_write():
                log.info("line resumed: reconciling every device")
                self.history.resumed(self.leadership and self.leadership.token)
                await self.active_line.open()
            else:
                log.info("line resumed")
        self._role_changed()

    def _on_switchover(self, request: SwitchoverRequest) -> None:
        if self.role is Role.ACTIVE:
            self._spawn(self._switch_over(request))

    async def _switch_over(self, request: SwitchoverRequest) -> None:
        assert self.leadership is not None and self.control is not None
        self.control.stand_aside()
        self.history.handing_over()
        reason = f"switchover to {request.to or 'a standby'} requested by {request.by or '?'}"
        if await self.leadership.hand_over(reason, self._wait_for_operations):
            self._role_changed()

    async def _wait_for_operations(self) -> None:
        """Waits (5 s at most) for each device's operation in progress, a write on the line
        included: with may_write() false, reconcile() only waits for its turn."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await asyncio.gather(*(sync.reconcile() for sync in self.devices.values()))

    # ------------------------------------------------------------------ store events

    async def _on_point(self, device_id: str, point: str, change: KeyChange) -> None:
        if point == "setPoint":
            self.health.store_seen(device_id, change.value, change.version)
        sync = self.devices.get(device_id)
        if sync is None or point not in sync.points:
            return
        for value, version in (*change.earlier, (change.value, change.version)):
            sync.saw_in_store(point, value, version)
        if self.role is Role.ACTIVE and sync.controller is not None:
            sync.remote_changed(point, change)
        else:
            # Standby, or active with the line still opening: the takeover reads the store
            # again when it reconciles the device.
            sync.follow_change(point, change)

    async def _on_record(self, device_id: str, change: KeyChange) -> None:
        sync = self.devices.get(device_id)  # None: taken off the line by a reload
        if self.role is not Role.ACTIVE and sync is not None:
            await sync.follow_record(change.value)

    async def _on_reconnect(self) -> None:
        log.info("reconnected to the broker")
        assert self.leadership is not None
        self.health.reconnected()
        self.leadership.lost_sight()
        if self.role is Role.ACTIVE:
            self._spawn(self._confirm_then_reconcile())
        else:
            self._spawn(self._look_and_contend())

    async def _confirm_then_reconcile(self) -> None:
        """Back on the link as active: nothing is written until a renewal confirms that the
        store still holds our lease (it may have restarted without it), then every device
        is compared for what changed meanwhile."""
        assert self.leadership is not None
        if await self.leadership.confirm():
            for sync in self.devices.values():
                sync.reconcile_soon()

    async def _look_and_contend(self) -> None:
        assert self.leadership is not None
        await self._look_at_the_lock()
        await self.leadership.contend()

    async def _look_at_the_lock(self) -> None:
        """Who holds the lock; absent, or still holding this process's own value (its
        renewals in flight kept the store's lease after its local deadline), whether the
        store kept its contents (a sync record is still there), so that a lease that merely
        expired, or this process's own, is not waited out again (Leadership.
        store_kept_its_contents says why that is enough)."""
        assert self.client is not None and self.leadership is not None
        try:
            asked_at = time.monotonic()
            holder = await self.leadership.lock.current_holder()
            self.leadership.saw_holder(holder, asked_at=asked_at)
            if holder is None or holder == self.leadership.holder:
                for sync in self.devices.values():
                    record, _ = await self.client.get(sync.keys.record)
                    if record is not None:
                        self.leadership.store_kept_its_contents(lock_absent_at=asked_at)
                        break
        except (StateStoreError, SessionError) as exc:
            log.debug("could not look at the lock after reconnecting: %s", exc)

    # ------------------------------------------------------------------ periodic jobs

    def _add_periodic_jobs(self) -> None:
        """Once the role is decided: the reconcile safety net, and telemetry (at once)."""
        s, every = self.settings, jobs.every
        self._jobs = [
            asyncio.create_task(every("reconcile", s.reconcile_interval_s, self._reconcile_job)),
            asyncio.create_task(
                every(
                    "telemetry",
                    s.telemetry.interval_s,
                    self._telemetry_job,
                    first_s=0.0,
                    jitter_s=s.telemetry.jitter_s,
                )
            ),
        ]

    async def _reconcile_job(self) -> None:
        if self.role is Role.ACTIVE:
            for sync in self.devices.values():
                sync.reconcile_soon()
            if self.active_line is not None:
                await self.active_line.recheck_claims()

    async def _telemetry_job(self) -> None:
        if self.session is None or not self.session.connected:
            return
        s = self.settings
        # The line's first: it says whether this instance can take over at all.
        line: telemetry.Snapshot | telemetry.LineSnapshot = self.line_snapshot()
        messages = [(s.telemetry_line_topic, line)]
        messages += [(s.telemetry_topic(name), self.snapshot(name)) for name in self.devices]
        await telemetry.publish(self.session, messages, interval_s=s.telemetry.interval_s)

    def snapshot(self, device_id: str, *, with_token: bool = True) -> telemetry.Snapshot:
        leadership = self.leadership
        return device_snapshot(
            device_id,
            self.devices[device_id],
            line=self.line.id,
            instance=self.settings.instance_id,
            active=self.role is Role.ACTIVE,
            token=leadership.token if leadership is not None and with_token else None,
            lock_losses=leadership.losses if leadership is not None else 0,
            bus=self.bus,
        )

    def _untokened_snapshot(self, device_id: str) -> telemetry.Snapshot:
        """Health's: a device's document does not show the token (see DeviceViews)."""
        return self.snapshot(device_id, with_token=False)

    def line_snapshot(self) -> telemetry.LineSnapshot:
        return line_snapshot(
            self.bus if self.role is Role.ACTIVE else None,
            self.devices,
            line=self.line.id,
            instance=self.settings.instance_id,
            rate=self._line_rate,
            round_trip_s=None if self.leadership is None else self.leadership.round_trips.worst_s,
            too_slow=self.leadership is not None and self.leadership.too_slow is not None,
        )

    # ------------------------------------------------------------------ health

    def view(self) -> InstanceView:
        """What health needs of this instance, now."""
        leadership, bus, session = self.leadership, self.bus, self.session
        losses = leadership.losses if leadership is not None else 0
        devices = self._device_views.views(
            self.devices, self._untokened_snapshot, self.role is Role.ACTIVE, losses, bus
        )
        return InstanceView(
            role=self.role,
            paused=self.control is not None and self.control.paused,
            connected=session is not None and session.connected,
            broker_failure=session.connect_failure if session is not None else None,
            healthy=self.healthy(),
            line_up=bus.line_up if bus is not None else None,
            token=leadership.token if leadership is not None else None,
            devices=devices,
            round_trip_s=None if leadership is None else leadership.round_trips.worst_s,
            too_slow=None if leadership is None else leadership.too_slow,
            ttl_s=self.settings.lock.ttl_ms / 1000,
            taking_over_s=None if leadership is None else leadership.taking_over_s(),
            not_ready=self.readiness.not_ready,
            config_hash=self.config_hash,
            reload_refused=self.reloads.refused,
        )

    def healthy(self) -> bool:
        if self.session is not None and self.session.error is not None:
            return False
        if self._clock_task is None:  # starting: only the event loop's turning is checked
            return True
        if any(job.done() for job in self._jobs):
            return False
        if self._lease_task is None or self._lease_task.done():
            return False
        return self._clock_task is not None and not self._clock_task.done()

    async def _watchdog(self, interval: float) -> None:
        # Runs on the event loop: a stalled loop stops the pings by itself.
        while True:
            if self.healthy():
                self.notifier.watchdog()
            await asyncio.sleep(interval)

    async def _start_endpoint(self) -> bool:
        """Listens unless the port is set empty; False (said) when it cannot."""
        settings, answer = self.settings.health, self.health.instance_document
        try:
            metrics = Metrics(self).exposition if settings.metrics else None
            self._endpoint = await open_endpoint(settings, answer, metrics)
        except UnusableSetting as exc:
            log.error("%s", exc)
            return False
        return True

    # ------------------------------------------------------------------ reload

    def request_reload(self, load: Callable[[], AgentSettings | str]) -> None:
        """SIGHUP: the devices and profiles read again, applied (agent.runtime.reload)."""
        self._spawn(self._reload(load))

    async def _reload(self, load: Callable[[], AgentSettings | str]) -> None:
        async with self._reloading:
            refused = await self._reload_files(load)
            await asyncio.to_thread(self.reloads.record, refused)  # for `agent reload`
            self.health.poke()  # a refusal shows in health until a reload loads

    async def _reload_files(self, load: Callable[[], AgentSettings | str]) -> str | None:
        """Why the files were refused, or None once they are running."""
        found = await asyncio.to_thread(load)  # files read off the event loop
        found = found if isinstance(found, str) else as_running(found)
        why = found if isinstance(found, str) else reload.why_not_reloadable(self.settings, found)
        if why is not None or isinstance(found, str):
            log.error("reload refused: %s; running configuration %s", why, self.config_hash)
            return why
        later = reload.restart_only(self.settings, found)
        if later:
            log.warning("reload: %s changed: applies at a restart", ", ".join(later))
        changes = reload.device_changes(self.line, found.line)
        if not changes or self.client is None or self.active_line is None:
            log.info("reload: no device changed (configuration %s)", self.config_hash)
            return None
        settings, before = reload.running(self.settings, found), self.config_hash
        client, lock = self.client, self.leadership.lock if self.leadership else None
        assert lock is not None
        async with self.active_line.lock:  # not while the line opens, closes, pauses
            self.settings = self.active_line.settings = settings
            self.line = self.health.line = settings.line
            self.config_hash = config_hash(settings)
            await reload.apply(
                changes,
                settings,
                self.devices,
                make=lambda device: make_sync(
                    settings, device, client, lock, self.may_write, self.later_saves
                ),
                watch=self._watch_device,
                client=client,
                bus=self.bus,
            )
        log.info(
            "reloaded: %s (configuration %s, was %s)", changes.words(), self.config_hash, before
        )
        return None

    def _spawn(self, work: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)
        return task


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task failed", exc_info=task.exception())
