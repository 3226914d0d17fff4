"""A test rig for the agent as operators run it: agent processes, against a state store
and a fake controller that the test holds in its own (background) event loop, so that it
can look inside them, take the broker down, or unplug the device."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import re
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from agent.emulator.embedded import EmbeddedStateStore
from agent.emulator.service import monotonic_ms, wall_clock_ms
from agent.protocol.hlc import Hlc
from agent.protocol.resp3 import encode_request
from agent.simulator.device import FakeDevice
from agent.simulator.line import FakeLine
from tests.soak.checker import Checker, LineEvent, StoreEvent
from tests.support.events import first_to_come
from tests.support.paho_client import PahoStoreClient
from tests.support.ports import free_port
from tests.support.processes import AgentProcess, stop_all
from tests.support.store_watch import watch_writes

T = TypeVar("T")
StoreSnapshot = dict[bytes, tuple[bytes, Hlc, Hlc | None, int | None]]
"""A store's keys: value, version, fencing token, and the milliseconds each had left."""
DEVICE = "thermostat-1"
SETPOINT_KEY = f"{DEVICE}\\setPoint"
LOCK_KEY = f"{DEVICE}\\lock"
RECORD_KEY = f"{DEVICE}\\synced"
RECORD_OF_20 = b'{"value":20.0,"version":"000000000000001:00000:seed"}'

ACTIVE = re.compile(r"became active \(fencing token (\S+)\)")
STANDBY = re.compile(r"started as standby")
STEPPED_DOWN = re.compile(r"stepped down to standby: (.*)")
APPLIED = re.compile(r"applied remote set point (\S+)")
PUBLISHED = re.compile(r"published set point (\S+)")
RECONCILED = re.compile(r"line open: \d+ device\(s\) reconciled")


class BackgroundLoop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 20.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, function: Callable[[], T]) -> T:
        async def wrapper() -> T:
            return function()

        return self.run(wrapper())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class Rig:
    def __init__(self, tmp_path: Path, *, ttl_ms: int = 1500, served_before: bool = True) -> None:
        """`served_before`: the store holds a sync record, as one that has served this pair
        before (and kept its contents) does: a first active need not wait a TTL for a lease
        an emptied store might have forgotten (see agent.pair.lock_delay)."""
        self.tmp_path = tmp_path
        self.ttl_ms = ttl_ms
        self.background = BackgroundLoop()
        self.port = free_port()
        self.store_events: list[StoreEvent] = []
        self._store_changed = threading.Condition()
        self._awaited_reads: dict[tuple[str, bytes], threading.Event] = {}
        """Every write the store handled, by its own record (for the wire check)."""
        self.store = self._make_store()
        self.device = self._make_device()
        self.background.run(self.store.start())
        self.background.run(self.device.start(tcp_port=0, panel_port=0))
        if served_before:
            self.background.call(self._seed)
        self.agents: list[AgentProcess] = []
        self.proxies: dict[str, Any] = {}
        self._client: PahoStoreClient | None = None

    def _make_store(self) -> EmbeddedStateStore:
        store = EmbeddedStateStore("127.0.0.1", self.port)
        watch_writes(store.store, self._record, self._read)
        return store

    def _record(self, event: StoreEvent) -> None:
        with self._store_changed:
            self.store_events.append(event)
            self._store_changed.notify_all()

    def wait_store_event(
        self, predicate: Callable[[StoreEvent], bool], timeout: float = 10.0
    ) -> StoreEvent:
        """The first write the store handled (so far, or to come) that `predicate` likes."""
        return first_to_come(
            self._store_changed,
            self.store_events,
            predicate,
            timeout,
            lambda: AssertionError(f"no such write in the store within {timeout} s"),
        )

    def _read(self, client: str, key: bytes) -> None:
        for (instance, wanted), event in list(self._awaited_reads.items()):
            if key == wanted and client.startswith("agent-") and f"-{instance}-" in client:
                event.set()
                del self._awaited_reads[instance, wanted]

    def next_read(self, instance: str, key: str = SETPOINT_KEY) -> threading.Event:
        """Set once the store handles the next GET of `key` by `instance`'s agent (its
        catch-up after a reconnect, say)."""
        event = threading.Event()
        self._awaited_reads[instance, key.encode()] = event
        return event

    def _make_device(self) -> Any:
        return FakeDevice(setpoint=20.0, time_constant_s=30.0)

    def _seed(self) -> None:
        self._write(RECORD_KEY, RECORD_OF_20)

    # ------------------------------------------------------------------ agents

    def env(self, instance: str, **extra: str) -> dict[str, str]:
        env = {
            "AGENT_DEVICE_ID": DEVICE,
            "AGENT_INSTANCE_ID": instance,
            "AGENT_STATE_DIR": str(self.tmp_path / f"state-{instance}"),
            "AGENT_MQTT__HOST": "127.0.0.1",
            "AGENT_MQTT__PORT": str(self.port),
            "AGENT_MQTT__RECONNECT_MIN_S": "0.05",
            "AGENT_MQTT__RECONNECT_MAX_S": "0.3",
            "AGENT_MQTT__REQUEST_TIMEOUT_S": "2",
            "AGENT_SERIAL__URL": str(self.device.tcp_url),
            "AGENT_SERIAL__POLL_INTERVAL_S": "0.2",
            "AGENT_SERIAL__MIN_WRITE_INTERVAL_S": "0.1",
            "AGENT_LOCK__TTL_MS": str(self.ttl_ms),
            "AGENT_TELEMETRY__INTERVAL_S": "1",
            "AGENT_TELEMETRY__JITTER_S": "0",
            "AGENT_LOG_LEVEL": "INFO",
        }
        env.update(extra)
        return env

    def start_agent(
        self, instance: str, *, via_proxy: bool = False, link_delay_s: float = 0.0, **extra: str
    ) -> AgentProcess:
        """An agent process; `via_proxy`: its link to the broker goes through a fault proxy
        of its own (rig.proxies[instance]), delayed `link_delay_s` each way from the first
        byte. It reaches the line through a port of its own, so that the line's records say
        which instance sent what (see wire_violations)."""
        env = self.env(instance, **extra)
        if "AGENT_SERIAL__URL" not in extra:
            env["AGENT_SERIAL__URL"] = self.background.run(self.device.open_port(instance))
        if via_proxy:
            from tests.harness.proxy import FaultProxy

            proxy = FaultProxy(("127.0.0.1", self.port))
            self.background.run(proxy.start())
            if link_delay_s:
                self.background.call(lambda: proxy.delay(link_delay_s))
            self.proxies[instance] = proxy
            env["AGENT_MQTT__PORT"] = str(proxy.port)
        process = AgentProcess([], env=env, merge_stderr=True)
        self.agents.append(process)
        return process

    def start_active(
        self, instance: str = "a", *, via_proxy: bool = False, **extra: str
    ) -> tuple[AgentProcess, str]:
        process = self.start_agent(instance, via_proxy=via_proxy, **extra)
        ttl_s = int(extra.get("AGENT_LOCK__TTL_MS", self.ttl_ms)) / 1000
        token = process.wait_for_new(ACTIVE, timeout=20 + ttl_s).group(1)
        process.wait_for_new(re.compile("started as active"))
        # Active before its devices are reconciled: the tests start from a settled line.
        process.wait_for(RECONCILED)
        return process, token

    # ------------------------------------------------------------------ the store

    @property
    def client(self) -> PahoStoreClient:
        if self._client is None:
            self._client = PahoStoreClient("127.0.0.1", self.port, f"remote-{time.monotonic_ns()}")
        return self._client

    def remote_set(self, value: bytes, timeout: float = 10.0) -> bytes:
        """A remote writer: fenced with the lock's current version, as protocol.md allows.
        With nobody holding the lock it waits for a holder, as a remote writer retries."""
        self.client.request("KEYNOTIFY", LOCK_KEY)
        deadline = time.monotonic() + timeout
        while (lock := self.client.request("GET", LOCK_KEY)).payload == b"$-1\r\n":
            remaining = deadline - time.monotonic()
            assert remaining > 0, "nobody took the lock"
            with contextlib.suppress(queue.Empty):
                self.client.notifications.get(timeout=remaining)
        token = lock.prop("__ts")
        return self.client.request("SET", SETPOINT_KEY, value, ft=token).payload

    def watch_lock(self) -> None:
        """Lock changes arrive on `client.notifications` from now on (earlier ones dropped)."""
        assert self.client.request("KEYNOTIFY", LOCK_KEY).payload == b"+OK\r\n"
        while not self.client.notifications.empty():
            self.client.notifications.get_nowait()

    def expect_renewal(self, instance: str, timeout: float) -> None:
        """The next change of the lock key (see watch_lock) is a renewal by `instance`."""
        try:
            payload: bytes | None = self.client.notifications.get(timeout=timeout).payload
        except queue.Empty:
            payload = None
        holder = None if payload is None else payload.rsplit(b"\r\n", 2)[-2]
        if holder is None or holder.split(b"#", 1)[0] != instance.encode():
            raise AssertionError(f"no renewal by {instance} within {timeout} s: {payload!r}")

    def store_value(self, key: str = SETPOINT_KEY) -> bytes | None:
        payload = self.client.request("GET", key).payload
        if payload == b"$-1\r\n":
            return None
        return payload.split(b"\r\n")[1]

    def wait_store_value(self, value: bytes, timeout: float = 10.0) -> None:
        """Waits for the set point key to hold `value`, on its notifications."""
        self.wait_key(SETPOINT_KEY, lambda held: held == value, timeout)

    def wait_key(
        self, key: str, predicate: Callable[[bytes | None], bool], timeout: float = 10.0
    ) -> bytes | None:
        """Waits for `key` to hold a value `predicate` likes, on its notifications."""
        self.client.request("KEYNOTIFY", key)
        deadline = time.monotonic() + timeout
        while not predicate(held := self.store_value(key)):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{key} never held what was waited for (last {held!r})"
            with contextlib.suppress(queue.Empty):
                self.client.notifications.get(timeout=remaining)
        return held

    def lock_holder(self) -> bytes | None:
        """The instance id of the lock's holder (its value is the instance id and a nonce
        of the holding process)."""
        value = self.store_value(LOCK_KEY)
        return None if value is None else value.split(b"#", 1)[0]

    def _write(self, key: str, value: bytes, token: str | None = None) -> None:
        now = str(Hlc(time.time_ns() // 1_000_000, 0, "remote"))
        outcome = self.store.store.handle(
            "remote", encode_request([b"SET", key.encode(), value]), now, token
        )
        assert outcome.reply.payload == b"+OK\r\n", outcome.reply.payload

    def write_directly(self, value: bytes) -> None:
        """A change reaching the store while the agents cannot (the broker is down)."""

        def write() -> None:
            # Fenced like a remote writer: the lock's version, or with no holder, the
            # token the key already carries.
            lock = self.store.store.entry(LOCK_KEY.encode())
            current = self.store.store.entry(SETPOINT_KEY.encode())
            fence = lock.version if lock else current.fencing_token if current else None
            self._write(SETPOINT_KEY, value, None if fence is None else str(fence))

        self.background.call(write)

    def broker_down(self) -> None:
        """The broker stops, the store keeping its contents (the rig's own client is made
        anew when next used)."""
        if self._client is not None:
            self._client.drop()
            self._client = None
        self.background.run(self.store.broker.stop())

    def broker_up(self) -> None:
        self.background.run(self.store.broker.start())

    def store_restart_forgetting(
        self, outage_s: float = 0.0, setpoint: bytes | None = None
    ) -> None:
        """The emulator restarts without its contents: the lock and the set point vanish.
        `setpoint`: the new store holds this set point before anyone reaches it (a change
        made while the agents were away)."""
        if self._client is not None:
            self._client.drop()
            self._client = None
        self.background.run(self.store.stop())
        if outage_s:
            time.sleep(outage_s)  # the outage is the fault itself, not a wait for an event
        self.store = self._make_store()
        if setpoint is not None:
            self.background.call(lambda: self._write(SETPOINT_KEY, setpoint))
        self.background.run(self.store.start())

    def snapshot(self) -> StoreSnapshot:
        """The store's keys as they are now, each expiry as the time it had left."""

        def take() -> StoreSnapshot:
            now = monotonic_ms()
            return {
                key: (
                    e.value,
                    e.version,
                    e.fencing_token,
                    None if e.expires_at_ms is None else e.expires_at_ms - now,
                )
                for key, e in self.store.store.entries().items()
            }

        return self.background.call(take)

    def store_restart_from(self, snapshot: StoreSnapshot, *, without: tuple[str, ...] = ()) -> None:
        """The emulator restarts holding what it held at `snapshot` (less the keys `without`):
        every write since is lost, acknowledged ones included (a store restored from a
        backup, or one whose log lost its tail). Its clock runs on past every version it
        handed out, as the emulator's journal keeps it."""
        if self._client is not None:
            self._client.drop()
            self._client = None
        clock = self.store.store.clock.current
        self.background.run(self.store.stop())
        self.store = self._make_store()

        def restore() -> None:
            now = wall_clock_ms()
            for key, (value, version, token, left_ms) in snapshot.items():
                if key.decode() not in without:
                    expires = None if left_ms is None else now + left_ms
                    self.store.store.restore(key, value, version, token, expires)
            self.store.store.restore_clock(clock)

        self.background.call(restore)
        self.background.run(self.store.start())

    def wire_violations(self) -> list[str]:
        """Every transaction an instance put on the line that is not within a lease the
        store granted it (tests/soak/checker.py), by the line's and the store's records."""
        checker = Checker({}, self.lock_key.encode())
        checker.store = list(self.store_events)
        records = self.background.call(lambda: self.device.records)
        checker.line = [
            LineEvent(
                r.at,
                r.client,
                r.address,
                r.kind,
                r.value,
                r.other_client is not None,
                r.request_ended_at,
                r.client.rpartition("-")[0] or None,
            )
            for r in records
        ]
        checker.check_wire()
        return [f"{v.kind} at {v.at:.3f}: {v.detail}" for v in checker.violations]

    @property
    def lock_key(self) -> str:
        return LOCK_KEY

    # ------------------------------------------------------------------ the device

    def wait_device(self, predicate: Callable[[FakeDevice], bool], timeout: float = 10) -> None:
        self.background.run(
            self.device.wait_for(lambda: predicate(self.device), timeout), timeout=timeout + 5
        )

    def panel(self, value: float) -> None:
        self.background.call(lambda: self.device.panel_setpoint(value))

    def device_writes(self) -> list[float]:
        return self.background.call(
            lambda: [w.value for w in self.device.writes if w.channel != "panel"]
        )

    def fault(self, kind: str, amount: float = 0.0) -> None:
        self.background.call(lambda: self.device.fault(kind, amount))

    def close(self) -> None:
        stop_all(self.agents)
        for proxy in self.proxies.values():
            self.background.run(proxy.stop())
        if self._client is not None:
            self._client.close()
        self.background.run(self.device.stop())
        self.background.run(self.store.stop())
        self.background.close()


class LineRig(Rig):
    """A pair serving a whole line of `units` thermostats on one fake line (TCP, as a serial
    device server shares it), devices `t01@1` ... `tNN@N` on line `floor3`."""

    LINE = "floor3"

    def __init__(
        self, tmp_path: Path, units: int, *, emulate_baud: int | None = None, **options: Any
    ) -> None:
        self.units = units
        self.emulate_baud = emulate_baud
        super().__init__(tmp_path, **options)

    def _make_device(self) -> Any:
        return FakeLine(
            units=self.units, setpoint=20.0, time_constant_s=30.0, emulate_baud=self.emulate_baud
        )

    def device_id(self, address: int) -> str:
        return f"t{address:02d}"

    @property
    def device_ids(self) -> list[str]:
        return [self.device_id(n) for n in range(1, self.units + 1)]

    def _seed(self) -> None:
        for device in self.device_ids:
            self._write(f"{device}\\synced", RECORD_OF_20)

    def env(self, instance: str, **extra: str) -> dict[str, str]:
        env = super().env(instance)
        del env["AGENT_DEVICE_ID"]
        env["AGENT_LINE_ID"] = self.LINE
        env["AGENT_DEVICES"] = ",".join(
            f"{self.device_id(n)}@{n}" for n in range(1, self.units + 1)
        )
        env.update(extra)
        return env

    def unit(self, address: int) -> Any:
        return self.device.unit(address)

    @property
    def lock_key(self) -> str:
        return f"{self.LINE}\\lock"

    def remote_set_device(self, address: int, value: bytes) -> bytes:
        """A remote writer fencing with the line's lock."""
        lock = self.client.request("GET", f"{self.LINE}\\lock")
        token = lock.prop("__ts")
        key = f"{self.device_id(address)}\\setPoint"
        return self.client.request("SET", key, value, ft=token).payload

    def setpoint_in_store(self, address: int) -> bytes | None:
        return self.store_value(f"{self.device_id(address)}\\setPoint")

    def wait_line(self, predicate: Callable[[Any], bool], timeout: float = 10) -> None:
        self.background.run(
            self.device.wait_for(lambda: predicate(self.device), timeout), timeout=timeout + 5
        )

    def wait_store(self, expected: dict[int, bytes], timeout: float = 10.0) -> None:
        """Waits until the store holds `expected` (address -> value), on notifications."""
        for address in expected:
            self.client.request("KEYNOTIFY", f"{self.device_id(address)}\\setPoint")
        deadline = time.monotonic() + timeout
        while True:
            current = {a: self.setpoint_in_store(a) for a in expected}
            if current == expected:
                return
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"the store holds {current}, not {expected}"
            with contextlib.suppress(queue.Empty):
                self.client.notifications.get(timeout=remaining)

    def writes(self, address: int) -> list[float]:
        return self.background.call(lambda: [w.value for w in self.unit(address).writes])


@contextlib.contextmanager
def line_rig(tmp_path: Path, units: int, **options: Any) -> Iterator[LineRig]:
    """A LineRig of `units` thermostats, closed at the end (for a test module's fixture)."""
    rig = LineRig(tmp_path, units, **options)
    try:
        yield rig
    finally:
        rig.close()
