"""The building of bench_building: agent processes in pairs, one fake line per pair, the
store under test, and the bench's own clients of the store (a probe timing renewals, an
observer of every lock, a subscriber counting what the broker routes), with the CPU of each
from /proc.

    python -m tests.bench.building --serve-lines N [--units 8]

serves N fake lines of 8 thermostats in one process, a TCP port per line, and prints
`lines URL ...` once they listen: the lines of a whole building cost one interpreter, so
that the bench's own load stays small beside the agents'.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent.client.session import Session
from agent.client.statestore import Condition, KeyChange, StateStoreClient
from agent.config import MqttSettings
from agent.message import Message
from agent.protocol import topics
from agent.protocol.hlc import Hlc
from agent.protocol.resp3 import decode_request
from tests.bench.footprint import cpu_seconds
from tests.support.mosquitto import Mosquitto
from tests.support.ports import free_port

UNITS = 8
READY = re.compile(r"started as (standby|active)")
STORE_READY = re.compile(r"state store ready at (\S+)")
LINES_READY = re.compile(r"^lines (.+)$", re.MULTILINE)
DEFAULTS = {  # the shipped defaults: a building runs them
    "AGENT_SERIAL__POLL_INTERVAL_S": "1",
    "AGENT_SERIAL__MIN_WRITE_INTERVAL_S": "1",
    "AGENT_TELEMETRY__INTERVAL_S": "10",
    "AGENT_TELEMETRY__JITTER_S": "1",
    "AGENT_LOG_LEVEL": "INFO",
}
PROBE_KEY = "bench-probe\\lock"
START_BATCH = 8
"""Agents started at once: 80 interpreters starting together would take the machine for a
minute and time each other out."""


def line_id(index: int) -> str:
    return f"line{index:03d}"


def lock_key(index: int) -> bytes:
    return f"{line_id(index)}\\lock".encode()


def device_id(line: int, unit: int) -> str:
    return f"l{line:03d}u{unit}"


# ---------------------------------------------------------------------------- processes


class Child:
    """`python -m MODULE ARGS`, its output in a file: 80 agents would fill pipes that
    nobody reads while the bench sleeps through a window."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, pattern: re.Pattern[str], timeout: float, step: float = 0.01) -> str:
        deadline = time.monotonic() + timeout
        while True:
            match = pattern.search(self.text())
            if match:
                return match.group(1)
            if not self.alive:
                raise RuntimeError(f"{self.proc.args!r} exited: {self.text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.proc.args!r}: no {pattern.pattern!r}")
            time.sleep(step)

    def terminate(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> None:
        self.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stop_all(children: Iterable[Child]) -> None:
    """SIGTERM to all first: 80 handovers one after another would take minutes."""
    children = list(children)
    for child in children:
        child.terminate()
    for child in children:
        child.stop()


class StoreUnderTest:
    kind: str
    host = "127.0.0.1"
    port: int

    def start(self) -> None:
        raise NotImplementedError

    def restart(self) -> tuple[float, float, float]:
        """Stops the broker and starts it again: when it was down (wall clock, and
        monotonic) and when it accepted connections again (monotonic)."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def pids(self) -> dict[str, int]:
        raise NotImplementedError


class EmbeddedStore(StoreUnderTest):
    kind = "embedded"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.child: Child | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.child = Child(
            [
                "agent",
                "emulator",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.directory / "data"),
                "--log-level",
                "WARNING",
            ],
            self.directory / f"emulator-{self.starts}.log",
        )
        self.child.wait_for(STORE_READY, 30, step=0.005)

    def restart(self) -> tuple[float, float, float]:
        assert self.child is not None
        self.child.stop()
        down, down_at = time.time(), time.monotonic()
        self.start()
        return down, down_at, time.monotonic()

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()

    def pids(self) -> dict[str, int]:
        assert self.child is not None
        return {"emulator": self.child.pid}


class MosquittoStore(StoreUnderTest):
    kind = "mosquitto"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.mosquitto = Mosquitto()
        self.port = self.mosquitto.port
        self.service: Child | None = None

    def start(self) -> None:
        self.mosquitto.start()
        self.service = Child(
            ["agent", "emulator", "--external", self.mosquitto.url, "--log-level", "WARNING"],
            self.directory / "external.log",
        )
        self.service.wait_for(STORE_READY, 30)

    def restart(self) -> tuple[float, float, float]:
        self.mosquitto.stop()
        down, down_at = time.time(), time.monotonic()
        self.mosquitto.start()  # returns once it accepts a connection
        return down, down_at, time.monotonic()

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
        self.mosquitto.stop()

    def pids(self) -> dict[str, int]:
        assert self.service is not None
        # Tests' Mosquitto keeps its process to itself; its pid is what /proc needs.
        process = self.mosquitto._proc
        assert process is not None
        return {"mosquitto": process.pid, "external service": self.service.pid}


# ---------------------------------------------------------------------------- fake lines


async def serve_lines(count: int, units: int) -> None:
    """`--serve-lines`: `count` fake lines of `units` each, one TCP port per line, until
    SIGTERM; prints `lines URL ...` once they listen."""
    from agent.simulator.line import FakeLine

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    lines = [FakeLine(units=units, setpoint=20.0, time_constant_s=60.0) for _ in range(count)]
    for line in lines:
        await line.start(tcp_port=0)
    print("lines " + " ".join(str(line.tcp_url) for line in lines), flush=True)
    await stop.wait()
    for line in lines:
        await line.stop()


# ---------------------------------------------------------------------------- the building


@dataclass
class Pair:
    index: int
    url: str
    agents: dict[str, Child] = field(default_factory=dict)
    starts: Counter[str] = field(default_factory=Counter)


class Building:
    def __init__(self, directory: Path, store: StoreUnderTest, pairs: int, ttl_ms: int) -> None:
        self.directory = directory
        self.store = store
        self.ttl_ms = ttl_ms
        self.lines = Child(
            ["tests.bench.building", "--serve-lines", str(pairs), "--units", str(UNITS)],
            directory / "lines.log",
        )
        urls = self.lines.wait_for(LINES_READY, 60).split()
        self.pairs = [Pair(index, url) for index, url in enumerate(urls, 1)]

    def env(self, pair: Pair, instance: str) -> dict[str, str]:
        return {
            **DEFAULTS,
            "AGENT_LINE_ID": line_id(pair.index),
            "AGENT_DEVICES": ",".join(
                f"{device_id(pair.index, n)}@{n}" for n in range(1, UNITS + 1)
            ),
            "AGENT_INSTANCE_ID": instance,
            "AGENT_STATE_DIR": str(self.directory / f"state-{pair.index}-{instance}"),
            "AGENT_MQTT__HOST": self.store.host,
            "AGENT_MQTT__PORT": str(self.store.port),
            "AGENT_SERIAL__URL": pair.url,
            "AGENT_LOCK__TTL_MS": str(self.ttl_ms),
        }

    def start_agent(self, pair: Pair, instance: str) -> Child:
        pair.starts[instance] += 1
        name = f"{line_id(pair.index)}-{instance}-{pair.starts[instance]}.log"
        log = self.directory / "agents" / name
        child = Child(["agent"], log, self.env(pair, instance))
        pair.agents[instance] = child
        return child

    def start_all(self) -> None:
        """Every pair's `a` first, then every `b`, a few at a time, each batch waited for
        until it said which role it started in."""
        for instance in ("a", "b"):
            for first in range(0, len(self.pairs), START_BATCH):
                batch = [
                    self.start_agent(pair, instance)
                    for pair in self.pairs[first : first + START_BATCH]
                ]
                for child in batch:
                    child.wait_for(READY, 60 + 3 * self.ttl_ms / 1000, step=0.05)

    def agents(self) -> list[Child]:
        return [child for pair in self.pairs for child in pair.agents.values()]

    def close(self) -> None:
        stop_all(self.agents())
        self.lines.stop()


# ---------------------------------------------------------------------------- the bench's clients


def settings_for(store: StoreUnderTest) -> MqttSettings:
    return MqttSettings(
        host=store.host,
        port=store.port,
        keepalive_s=10,
        reconnect_min_s=0.02,
        reconnect_max_s=0.1,
        request_timeout_s=10.0,
    )


async def connected_client(settings: MqttSettings, name: str) -> tuple[Session, StateStoreClient]:
    session = Session(settings, client_id=f"bench-{name}-{os.getpid()}")
    await session.start(wait=True, timeout=30)
    client = StateStoreClient(session, request_timeout_s=10.0)
    await client.start()
    return session, client


class Probe:
    """Sends the agents' renewal (SET NEX PX on a lock of its own, from the project's
    client) at a steady rate and times each answer."""

    def __init__(self, client: StateStoreClient, ttl_ms: int, hz: float) -> None:
        self.client = client
        self.ttl_ms = ttl_ms
        self.period_s = 1 / hz
        self.samples: list[tuple[float, float]] = []  # (monotonic, round trip)
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                result = await self.client.set(
                    PROBE_KEY, b"probe", condition=Condition.NEX, expiry_ms=self.ttl_ms
                )
                ended = time.monotonic()
                if result.applied:
                    self.samples.append((ended, ended - started))
                else:
                    self.failures += 1
            except Exception:
                self.failures += 1
            await asyncio.sleep(max(0.0, started + self.period_s - time.monotonic()))

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def between(self, start: float, end: float) -> list[float]:
        return [rt for at, rt in self.samples if start <= at <= end]


@dataclass(frozen=True)
class Grant:
    line: int
    holder: str  # the instance id ("a" or "b"); "" for a DELETE
    version: Hlc  # the version the store gave it
    at: float  # when the observer learnt of it (monotonic)
    read: bool  # found by the observer's read when it registered, not notified


class Observer:
    """Watches every line's lock; keeps each change with its version and when it came.

    Times are the observer's own (when it learnt of a grant), never a version's: the
    embedded store comes back from its journal with its clock ahead of the wall clock (a
    bound past every version it handed out), so versions order grants but do not time
    them. A grant counts as one after a fault by its version (after a restart: newer than
    the wall clock when the broker went down; the restored clock only moves forward).

    After a broker restart it connects anew and registers every lock at once (the client's
    own catch-up registers one key after another, and a grant made meanwhile could be
    followed by the next renewal before it reads the key). A grant made before the
    observer was back is known by the read that comes with the registration, at the time
    of that read: later than the grant (an upper bound), and counted apart."""

    RETRY_S = 0.25
    """How long a registration may take before it is sent again (an external service that
    is not back yet never answers: its request was routed to nobody)."""

    def __init__(self, settings: MqttSettings, lines: int) -> None:
        self.settings = settings
        self.lines = lines
        self.changes: list[Grant] = []
        self.connections = 0
        self.session: Session | None = None
        self.client: StateStoreClient | None = None

    async def connect(self) -> None:
        self.connections += 1
        self.session, self.client = await connected_client(
            self.settings, f"observer{self.connections}"
        )
        pending = list(range(1, self.lines + 1))
        while pending:
            done = await asyncio.gather(*(self._watch(n) for n in pending), return_exceptions=True)
            pending = [n for n, outcome in zip(pending, done, strict=True) if outcome is not None]

    async def _watch(self, line: int) -> None:
        assert self.client is not None
        handler = self._handler(line)
        value, version = await self.client.observe(lock_key(line), handler, timeout=self.RETRY_S)
        handler(KeyChange(lock_key(line), "SET", value, version, synthetic=True))

    async def disconnect(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.session is not None:
            await self.session.stop()
        self.session = self.client = None

    def _handler(self, line: int) -> Callable[[KeyChange], None]:
        def handle(change: KeyChange) -> None:
            if change.version is None:
                return
            holder = ""
            if change.kind == "SET" and change.value is not None:
                holder = change.value.decode(errors="replace").split("#", 1)[0]
            grant = Grant(line, holder, change.version, time.monotonic(), change.synthetic)
            self.changes.append(grant)

        return handle

    def first_grant(
        self,
        line: int,
        *,
        newer_than_ms: float = 0,
        came_after: float = 0,
        other_than: str | None = None,
    ) -> Grant | None:
        """The first grant or renewal of a line's lock the observer learnt of, among those
        with a version newer than `newer_than_ms` (wall clock), learnt of after
        `came_after` (monotonic), to another instance than `other_than`."""
        found = [
            change
            for change in self.changes
            if change.line == line
            and change.holder
            and change.version.wall_ms > newer_than_ms
            and change.at > came_after
            and change.holder != other_than
        ]
        return min(found, key=lambda change: change.at, default=None)

    def changed_hands(self, since: float, lines: Iterable[int]) -> int:
        """How many times a lock went to another instance, learnt of since `since`
        (monotonic)."""
        count = 0
        for line in lines:
            seen = sorted(
                (change for change in self.changes if change.line == line and change.holder),
                key=lambda change: change.version,
            )
            for before, after in itertools.pairwise(seen):
                count += after.at > since and after.holder != before.holder
        return count


async def lock_holders(client: StateStoreClient, lines: int) -> dict[int, str | None]:
    """Each line's lock holder now (its instance id)."""
    read = await asyncio.gather(*(client.get(lock_key(n)) for n in range(1, lines + 1)))
    return {
        n: None if value is None else value.decode(errors="replace").split("#", 1)[0]
        for n, (value, _) in enumerate(read, 1)
    }


class Tap:
    """A subscriber to `#`: counts every PUBLISH the broker routes, by what it is, and
    keeps when each store request came (the bench's own requests are left out)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.requests_at: list[float] = []
        self.session: Session | None = None

    def on_message(self, message: Message) -> None:
        topic = message.topic
        if topic == topics.INVOKE_TOPIC:
            if "/bench-" in (message.response_topic or ""):
                return  # the probe's or the observer's
            self.counts[request_kind(message.payload)] += 1
            self.requests_at.append(time.monotonic())
        elif topic.endswith("/command/invoke/response"):
            if "/bench-" not in topic:
                self.counts["answer"] += 1
        elif "/command/notify/" in topic:
            self.counts["notification"] += 1
        else:
            self.counts["agents' own (telemetry, health, status)"] += 1

    async def start(self, settings: MqttSettings) -> None:
        """Subscribes; returns once connected (after a restart: once the broker is back)."""
        self.session = Session(settings, client_id=f"bench-tap-{os.getpid()}")
        await self.session.subscribe("#", self.on_message, qos=0)
        await self.session.start(wait=True, timeout=60)

    async def stop(self) -> Counter[str]:
        counts = Counter(self.counts)
        if self.session is not None:
            await self.session.stop()
        return counts


def request_kind(payload: bytes) -> str:
    try:
        args = decode_request(payload)
    except Exception:
        return "request: other"
    command = args[0].upper().decode(errors="replace") if args else "?"
    key = args[1] if len(args) > 1 else b""
    if key.endswith(b"\\lock"):
        return f"request: {command} lock"
    return f"request: {command} other keys"


async def health_round_trips(settings: MqttSettings, wait_s: float = 2.0) -> list[float]:
    """The agents' own longest recent round trip to the store (their retained health)."""
    found: dict[str, float] = {}

    def on_message(message: Message) -> None:
        with contextlib.suppress(ValueError, TypeError):
            document = json.loads(message.payload)
            if document.get("round_trip_ms") is not None:
                found[message.topic] = float(document["round_trip_ms"]) / 1000

    session = Session(settings, client_id=f"bench-health-{os.getpid()}")
    await session.subscribe("agents/+/+/health", on_message)
    await session.start(wait=True, timeout=30)
    await asyncio.sleep(wait_s)
    await session.stop()
    return list(found.values())


# ---------------------------------------------------------------------------- CPU


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


class CpuWindow:
    """CPU time of groups of processes and of the machine over a window."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups
        self.started = time.monotonic()
        self.before = {name: self._cpu(pids) for name, pids in groups.items()}
        self.bench_before = time.process_time()
        self.machine_before = machine_ticks()

    @staticmethod
    def _cpu(pids: list[int]) -> float:
        total = 0.0
        for pid in pids:
            with contextlib.suppress(OSError):
                total += cpu_seconds(pid)
        return total

    def end(self) -> dict[str, float]:
        """Each group's share of one core; 'machine': the share of all cores busy."""
        elapsed = time.monotonic() - self.started
        shares = {
            name: (self._cpu(pids) - self.before[name]) / elapsed
            for name, pids in self.groups.items()
        }
        shares["bench"] = (time.process_time() - self.bench_before) / elapsed
        busy, total = machine_ticks()
        shares["machine"] = (busy - self.machine_before[0]) / max(1, total - self.machine_before[1])
        shares["elapsed"] = elapsed
        return shares


def main() -> None:
    parser = argparse.ArgumentParser(description="serve fake lines for bench_building")
    parser.add_argument("--serve-lines", type=int, required=True)
    parser.add_argument("--units", type=int, default=UNITS)
    args = parser.parse_args()
    asyncio.run(serve_lines(args.serve_lines, args.units))


if __name__ == "__main__":
    main()
