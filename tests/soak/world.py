"""The soak's world: the embedded store, the fake line and a pair of agent processes, each
reaching the broker through a fault proxy of its own and the line through a port of its own
(so that every transaction on the wire names the instance that sent it), with what the
checker is fed from them.

Two shapes of line: `multidrop`, N addressed units on one line (`AGENT_LINE_ID` and
`AGENT_DEVICES`, the lock `soak\\lock`), and `p2p`, one unaddressed controller configured as a
single device (`s01` alone on a line of its name, the lock `s01\\lock`), whose line-protocol
driver has to wait out a late reply before its next request. Units are named by slot 1..N; on
a p2p line slot 1 is the one unit (address None).

Each unit is a whole thermostat: its device names the built-in profile `sim`, and the agents
keep every point it writes (set point, heating and cooling set points, mode, fan, occupancy),
each in its key; with `points=("setPoint",)` the devices name no profile and the set point is
all there is, as before profiles.
"""

from __future__ import annotations

import json
import random
import re
import signal
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.controller import line_protocol as lp
from agent.controller import points as known_points
from agent.controller.interface import PointValue
from agent.controller.line_driver import TURNAROUND_S
from agent.controller.points import FAN, MODE
from agent.controller.sim_profile import SIM
from agent.controller.timing import LineTiming
from agent.emulator.embedded import EmbeddedStateStore
from agent.emulator.log_records import changes, replay
from agent.protocol.hlc import Hlc
from agent.simulator.line import FakeLine, RequestRecord, Unit
from agent.sync.decisions import Synced
from agent.sync.record import PointRecord, encode_record
from tests.harness.proxy import FaultProxy
from tests.soak.checker import Checker, LineEvent, UnitEvent
from tests.support.paho_client import PahoStoreClient
from tests.support.ports import free_port
from tests.support.processes import AgentProcess
from tests.support.rig import RECORD_OF_20, BackgroundLoop
from tests.support.store_watch import watch_writes

LINE = "soak"
ACTIVE = re.compile(r"became active")
STEPPED_DOWN = re.compile(r"stepped down to standby|handing over")
READY = re.compile(r"started as (standby|active)")
VALUES = [n / 2 for n in range(30, 60)]  # 15.0 .. 29.5, on the controllers' grid
SET_POINT = "setPoint"
POINTS = SIM.writable
"""The points of a whole thermostat (the sim profile's) that the agents write."""
VALUES_OF: dict[str, list[PointValue]] = {
    SET_POINT: list(VALUES),
    # Heating 15..21 and cooling 23..29: never against the deadband (1.0) whatever the
    # order in which the changes of the two reach the unit, so no change is refused.
    "heatSetPoint": [n / 2 for n in range(30, 43)],
    "coolSetPoint": [n / 2 for n in range(46, 59)],
    "mode": list(MODE.choices),
    "fan": list(FAN.choices),
    "occupied": [True, False],
}
"""What the load sets each point to."""
PROBE_S = 2.0
QUEUED_S = 0.005
"""A request the fake took this soon after its connection's previous transaction ended may
have waited for it in the connection."""
SHAPES = ("multidrop", "p2p")
SEED_VERSION = json.loads(RECORD_OF_20)["version"]
"""The version of the seeded sync records' values: older than any the store gives."""


READ_POINTS: dict[str, tuple[str, ...]] = {"GET SP": (SET_POINT,), "GET STATE": (SET_POINT,)}
"""The points a read of the line protocol fetches, where not every point (GET POINTS)."""


def device_id(address: int) -> str:
    return f"s{address:02d}"


def point_key(slot: int, point: str) -> str:
    return f"{device_id(slot)}\\{point}"


def _parse(point: str, raw: bytes) -> PointValue | None:
    try:
        return known_points.parse(known_points.point(point), raw)
    except known_points.InvalidValue:
        return None


def _point_shown(point: str) -> str:
    """A point's name before its value in the logs, none for the set point (as before)."""
    return "" if point == SET_POINT else f"{point} "


def wait_until(predicate: Any, timeout: float, step: float = 0.05) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(step)
    return None


@dataclass
class Agent:
    name: str
    process: AgentProcess
    proxy: FaultProxy
    stopped: bool = False  # SIGSTOPped by the harness
    expected_exit: bool = False  # ended by the harness
    active: bool = False
    read_lines: int = 0
    started_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None
    """When its "started as" line was read (monotonic)."""
    stamped: list[tuple[float, str]] = field(default_factory=list)
    """Its lines, each with when the soak read it (monotonic, within a sampling step)."""

    @property
    def alive(self) -> bool:
        return self.process.proc.poll() is None


@dataclass
class Stats:
    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    recovery: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    changes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    died: list[str] = field(default_factory=list)
    not_recovered: list[str] = field(default_factory=list)


class World:
    def __init__(
        self,
        directory: Path,
        units: int,
        ttl_ms: int,
        rng: random.Random,
        *,
        shape: str = "multidrop",
        min_write_interval_s: float = 0.5,
        baud: int = 115_200,
        emulate_baud: int | None = 115_200,
        poll_interval_s: float | None = None,
        log_level: str = "INFO",
        points: tuple[str, ...] = POINTS,
    ) -> None:
        """`points`: those the load changes (the set point alone: the devices name no
        profile)."""
        if shape not in SHAPES:
            raise ValueError(f"shape must be one of {SHAPES}, not {shape!r}")
        unknown = [p for p in points if p not in POINTS]
        if not points or unknown:
            raise ValueError(f"points must be some of {', '.join(POINTS)}, not {unknown}")
        self.points = points
        self.profiled = points != (SET_POINT,)
        """The devices name the profile `sim` (every point kept)."""
        self.kept = POINTS if self.profiled else (SET_POINT,)
        """The points the agents keep in sync, each checked."""
        self.directory = directory
        self.shape = shape
        self.units = 1 if shape == "p2p" else units
        self.ttl_ms = ttl_ms
        self.rng = rng
        self.min_write_interval_s = min_write_interval_s
        self.log_level = log_level
        self.baud = baud
        self.emulate_baud = emulate_baud
        self.poll_interval_s = poll_interval_s or (0.2 if self.units <= 8 else 1.0)
        timing = LineTiming(baud, 10, TURNAROUND_S)
        self.timing = timing
        self.reply_timeout_s = timing.reply_timeout_s(lp.MAX_LINE)
        """The agents' reply timeout (the line driver's default at `baud`)."""
        self.slow_reply_s = timing.chars_s(2 * lp.MAX_LINE) + 0.02
        """A reply that took longer than this came from a slow unit."""
        self.slots = list(range(1, self.units + 1))
        self.line_id = device_id(1) if shape == "p2p" else LINE
        self.lock_key = f"{self.line_id}\\lock"
        self.background = BackgroundLoop()
        self.port = free_port()
        self.data_dir = directory / "store"
        self.checker = Checker(
            {n: device_id(n) for n in self.slots},
            self.lock_key.encode(),
            points=self.kept,
        )
        self.store_up = False
        self.store = self._start_store(keep=True)
        self.line = FakeLine(
            units=None if shape == "p2p" else self.units,
            setpoint=20.0,
            time_constant_s=30.0,
            emulate_baud=emulate_baud,
        )
        self.background.run(self.line.start(tcp_port=0, panel_port=0))
        self.background.call(self._seed)
        self.agents: dict[str, Agent] = {}
        self.former: list[Agent] = []
        """Agents that were replaced by a restart, for their logs."""
        self.client = PahoStoreClient("127.0.0.1", self.port, "soak-driver")
        self.stats = Stats()
        self.late_replies = 0
        """Transactions whose reply came after the sender had given up on it."""
        self.missed_records = 0
        """Line records dropped before the soak read them (the check saw less)."""
        self._line_seq = 0
        self._last_of: dict[str, RequestRecord] = {}
        self._unit_seen: dict[tuple[int, str], float] = {}
        self._roles = threading.RLock()
        self._collecting = threading.Lock()

    # ------------------------------------------------------------------ the store

    def _start_store(self, *, keep: bool) -> EmbeddedStateStore:
        if not keep:
            for file in self.data_dir.glob("*"):
                file.unlink()
        store = EmbeddedStateStore("127.0.0.1", self.port, data_dir=self.data_dir)
        self._hook(store)
        self.background.run(store.start())
        self.store_up = True
        return store

    def _hook(self, store: EmbeddedStateStore) -> None:
        watch_writes(store.store, self.checker.store.append)

    def _seed(self) -> None:
        """Each unit's sync record, as a line already in sync would have it: the set point
        at 20.0 (and on a whole thermostat every other point kept at the unit's value),
        each synced at an old version; the points' keys are left to the agents."""
        for n in self.slots:
            now = f"{time.time_ns() // 1_000_000:015d}:00000:seed"
            key = f"{device_id(n)}\\synced".encode()
            record = self._record_of(n) if self.profiled else RECORD_OF_20
            payload = b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
                len(key),
                key,
                len(record),
                record,
            )
            self.store.store.handle("seed", payload, now, None)

    def _record_of(self, slot: int) -> bytes:
        held = self.unit_at(slot).core.point_values(time.monotonic())
        version = Hlc.parse(SEED_VERSION)
        return encode_record(
            Synced(held[SET_POINT], version),
            points={
                point: PointRecord(Synced(held[point], version))
                for point in self.kept
                if point != SET_POINT
            },
        )

    def restart_store(self, *, keep: bool, outage_s: float, losing: int = 0) -> int:
        """The store restarts after `outage_s`, with its contents (`keep`) or without them;
        `losing`: having lost its last that many changes (see _lose_tail). Returns how many
        changes it lost so."""
        self.store_up = False
        self.background.run(self.store.stop())
        if not keep:
            self.checker.wiped_at.append(time.monotonic())
        lost = self._lose_tail(losing) if keep else 0
        time.sleep(outage_s)  # the outage is the fault itself
        self.store = self._start_store(keep=keep)
        self.client.close()
        self.client = PahoStoreClient("127.0.0.1", self.port, f"soak-driver-{time.monotonic_ns()}")
        return lost

    def _lose_tail(self, count: int) -> int:
        """Cuts the stopped store's log before its last `count` changes (every record after
        them too, clock records among them), acknowledged ones included: a log that lost its
        tail, or a failover of the real service. The checker is told what each key holds
        after it and which values it lost."""
        log = self.data_dir / "store.log"
        data = log.read_bytes()
        lost = changes(data)[-count:] if count else []
        if not lost:
            return 0
        cut = lost[0][0]
        with log.open("r+b") as file:
            file.truncate(cut)
        held = replay(data[:cut]).entries
        self.checker.rolled_back.append(
            (
                time.monotonic(),
                {
                    key: (
                        held[key].value if key in held else None,
                        [entry.value for _, k, entry in lost if k == key and entry is not None],
                    )
                    for key in {key for _, key, _ in lost}
                },
            )
        )
        return len(lost)

    # ------------------------------------------------------------------ agents

    def agent_env(self, name: str, line_url: str, proxy_port: int) -> dict[str, str]:
        env = {
            "AGENT_INSTANCE_ID": name,
            "AGENT_STATE_DIR": str(self.directory / f"state-{name}"),
            "AGENT_MQTT__HOST": "127.0.0.1",
            "AGENT_MQTT__PORT": str(proxy_port),
            "AGENT_MQTT__KEEPALIVE_S": "2",
            "AGENT_MQTT__RECONNECT_MIN_S": "0.1",
            "AGENT_MQTT__RECONNECT_MAX_S": "2",
            "AGENT_MQTT__REQUEST_TIMEOUT_S": "2",
            "AGENT_SERIAL__URL": line_url,
            "AGENT_SERIAL__BAUDRATE": str(self.baud),
            "AGENT_SERIAL__POLL_INTERVAL_S": str(self.poll_interval_s),
            "AGENT_SERIAL__MIN_WRITE_INTERVAL_S": str(self.min_write_interval_s),
            "AGENT_SERIAL__PROBE_INTERVAL_S": str(PROBE_S),
            # The load changes panels while a unit is away (silent, the line unplugged):
            # the unit's values win once it is back, as the checker expects of a panel
            # change (the store's winning instead is tests/agent/test_unit_back.py's).
            "AGENT_SERIAL__AFTER_ABSENCE": "unit",
            "AGENT_LOCK__TTL_MS": str(self.ttl_ms),
            "AGENT_TELEMETRY__INTERVAL_S": "5",
            "AGENT_LOG_LEVEL": self.log_level,
        }
        if not self.profiled and self.shape == "p2p":
            env["AGENT_DEVICE_ID"] = device_id(1)
        elif not self.profiled:
            env["AGENT_LINE_ID"] = LINE
            env["AGENT_DEVICES"] = ",".join(f"{device_id(n)}@{n}" for n in self.slots)
        else:
            # A p2p controller alone on a line of its name: the single device, with a profile.
            env["AGENT_LINE_ID"] = self.line_id
            env["AGENT_DEVICES"] = json.dumps(
                [
                    {"id": device_id(n), "address": self.address_of(n), "profile": SIM.name}
                    for n in self.slots
                ]
            )
        return env

    def start_agent(
        self, name: str, *, link_delay_s: float = 0.0, env: dict[str, str] | None = None
    ) -> Agent:
        """Starts instance `name` (again), with a fault proxy of its own (delayed
        `link_delay_s` each way from the first byte) and its own port on the line (the same
        port as before, when it restarts); `env` adds to its settings."""
        proxy = FaultProxy(("127.0.0.1", self.port))
        self.background.run(proxy.start())
        if link_delay_s:
            self.background.call(lambda: proxy.delay(link_delay_s))
        url = self.background.run(self.line.open_port(name))
        settings = self.agent_env(name, url, proxy.port) | (env or {})
        process = AgentProcess([], env=settings, merge_stderr=True)
        agent = Agent(name, process, proxy)
        with self._roles:
            old = self.agents.get(name)
            if old is not None:
                self._read(old)
                self.background.run(old.proxy.stop())
                self.former.append(old)
            self.agents[name] = agent
        return agent

    def refresh_roles(self) -> None:
        with self._roles:
            for agent in self.agents.values():
                self._read(agent)

    def _read(self, agent: Agent) -> None:
        if not agent.stopped and not agent.process.proc.stdout.closed:  # type: ignore[union-attr]
            agent.process.drain()
        now = time.monotonic()
        for line in agent.process.lines[agent.read_lines :]:
            agent.stamped.append((now, line))
            if ACTIVE.search(line):
                agent.active = True
            elif STEPPED_DOWN.search(line):
                agent.active = False
            elif agent.ready_at is None and READY.search(line):
                agent.ready_at = now
        agent.read_lines = len(agent.process.lines)
        code = agent.process.proc.poll()
        if code is not None:
            agent.active = False
            if not agent.expected_exit and not any(
                d.startswith(f"{agent.name} ") for d in self.stats.died
            ):
                tail = "".join(agent.process.lines[-5:])
                self.stats.died.append(f"{agent.name} exited {code}: {tail}")

    def active(self) -> Agent | None:
        self.refresh_roles()
        with self._roles:
            live = [a for a in self.agents.values() if a.active and not a.stopped]
        return live[0] if live else None

    def standby(self) -> Agent | None:
        """A live instance that is not the active one."""
        return self.pair()[1]

    def pair(self) -> tuple[Agent | None, Agent | None]:
        """The active instance and a live other one, as of one look."""
        active = self.active()
        with self._roles:
            others = [a for a in self.agents.values() if a is not active and a.alive]
        return active, others[0] if others else None

    def whole(self) -> bool:
        """Both instances run and have started (one of them may be the active)."""
        self.refresh_roles()
        with self._roles:
            return len(self.agents) == 2 and all(
                a.alive and a.ready_at is not None and not a.stopped for a in self.agents.values()
            )

    def lock_holder(self) -> str | None:
        """The instance the store names as the lock's holder now (None: nobody, or the
        store is down)."""
        if not self.store_up:
            return None

        def read() -> str | None:
            store = self.store.store
            entry = store.entry(self.lock_key.encode())
            if entry is None:
                return None
            if entry.expires_at_ms is not None and entry.expires_at_ms <= store._monotonic():
                return None
            return entry.value.decode(errors="replace").split("#")[0]

        try:
            return self.background.call(read)
        except Exception:
            return None

    def driving(self) -> bool:
        """An instance holds the lease and drives the line."""
        agent = self.active()
        return agent is not None and self.lock_holder() == agent.name

    def live(self) -> bool:
        """What the liveness sampler notes: some instance said it became active (and not
        since that it stepped down), runs, is not stopped, and the store holds the lock for
        it now."""
        holder = self.lock_holder()
        if holder is None:
            return False
        self.refresh_roles()
        with self._roles:
            agent = self.agents.get(holder)
            return agent is not None and agent.active and not agent.stopped and agent.alive

    def driving_since(self, moment: float) -> bool:
        """An active instance holds the lease by a grant or renewal of the store's after
        `moment` (it is back, not just still named in the store)."""
        return self.leased_at(moment) is not None

    def leased_at(self, moment: float) -> float | None:
        """When the store granted or renewed the active instance's lease first after
        `moment` (its own record's time, not when this asks), None if it did not."""
        agent = self.active()
        if agent is None:
            return None
        lock = self.lock_key.encode()
        holder = agent.name.encode()
        first = None
        for event in reversed(self.checker.store):
            if event.at <= moment:
                break
            if (
                event.key == lock
                and event.accepted
                and (event.value or b"").split(b"#")[0] == holder
            ):
                first = event.at
        return first

    def line_answered_since(self, address: int | None, moment: float) -> bool:
        def answered() -> bool:
            for record in reversed(self.line.records):
                if record.at <= moment:
                    return False
                if record.answered and (address is None or record.address == address):
                    return True
            return False

        return bool(self.background.call(answered))

    # ------------------------------------------------------------------ units

    def unit_at(self, slot: int) -> Unit:
        return self.line.unit(None if self.shape == "p2p" else slot)

    def address_of(self, slot: int) -> int | None:
        """The address on the line of a slot (None on a p2p line)."""
        return None if self.shape == "p2p" else slot

    # ------------------------------------------------------------------ the line's records

    def collect(self) -> None:
        """Feeds the checker what the line and its units recorded since the last call."""
        with self._collecting:
            self._collect()

    def _collect(self) -> None:
        seen = dict(self._unit_seen)
        slot_of = {None: 1} if self.shape == "p2p" else {n: n for n in self.slots}

        def take() -> tuple[list[RequestRecord], list[UnitEvent]]:
            records = self.line.records_since(self._line_seq)
            events: list[UnitEvent] = []
            for unit in self.line.units:
                slot = slot_of[unit.address]
                for kind, items in (("panel", unit.panel_changes), ("write", unit.writes)):
                    last = seen.get((slot, kind), float("-inf"))
                    new = []
                    for item in reversed(items):
                        if item.at <= last:
                            break
                        if item.stored is None:
                            continue  # refused: the unit kept what it held
                        new.append(UnitEvent(item.at, slot, kind, item.stored, item.point))
                    if new:
                        seen[(slot, kind)] = new[0].at
                    events.extend(reversed(new))
            return records, events

        records, events = self.background.call(take)
        if records and records[0].seq > self._line_seq + 1 and self._line_seq:
            self.missed_records += records[0].seq - self._line_seq - 1
        for record in records:
            self._line_seq = max(self._line_seq, record.seq)
            self.checker.line.append(self._line_event(record, slot_of))
        self.checker.units.extend(events)
        self._unit_seen = seen

    def _line_event(self, record: RequestRecord, slot_of: dict[int | None, int]) -> LineEvent:
        instance = record.client.rsplit("-", 1)[0] if "-" in record.client else None
        if instance == "tcp":
            instance = None
        sent = record.at - record.waited_s  # its bytes reached the line then
        # The fake reads a connection's next request only once it has answered the one
        # before: a request taken at the end of a long transaction of its own connection (a
        # slow unit's) may have been sent any time after that one's request.
        before = self._last_of.get(record.client)
        if (
            before is not None
            and before.ended_at - before.request_ended_at > self.slow_reply_s
            and sent <= before.ended_at + QUEUED_S
        ):
            sent = min(sent, before.request_ended_at)
        self._last_of[record.client] = record
        # The instance's own bytes are its request's; the reply is the unit's. A reply after
        # the sender's reply timeout (and the longest reply's line time) is one it gave up
        # on: counted, to show that the faults that make them happened.
        patience = self.reply_timeout_s + self.timing.chars_s(len(record.line) + 2 + lp.MAX_LINE)
        if record.answered and record.ended_at - record.request_ended_at > patience:
            self.late_replies += 1
        return LineEvent(
            record.at,
            record.client,
            slot_of.get(record.address, record.address),
            record.kind,
            record.value,
            record.other_client is not None,
            record.request_ended_at,
            instance,
            sent,
            READ_POINTS.get(record.kind),
        )

    def unit_points(self) -> dict[tuple[int, str], PointValue]:
        """What every unit holds in each point kept, by (slot, point)."""

        def read() -> dict[tuple[int, str], PointValue]:
            now = time.monotonic()
            held = {n: self.unit_at(n).core.point_values(now) for n in self.slots}
            return {(n, p): held[n][p] for n in self.slots for p in self.kept}

        return self.background.call(read)

    def stored_points(self) -> dict[tuple[int, str], bytes | None]:
        """What the store holds in each point's key, by (slot, point)."""

        def read() -> dict[tuple[int, str], bytes | None]:
            found: dict[tuple[int, str], bytes | None] = {}
            for n in self.slots:
                for point in self.kept:
                    entry = self.store.store.entry(point_key(n, point).encode())
                    found[(n, point)] = None if entry is None else entry.value
            return found

        return self.background.call(read)

    def agree(self) -> bool:
        units, stored = self.unit_points(), self.stored_points()
        return all(
            (value := stored[key]) is not None
            and known_points.same(_parse(key[1], value), units[key])
            for key in units
        )

    def settle_and_check(self) -> dict[str, Any]:
        """Once faults stop: waits for every point kept of every controller and its key to
        agree, then runs the checker over everything recorded; its summary."""
        wait_until(self.agree, 10 * self.ttl_ms / 1000 + 20, step=0.2)
        self.collect()
        final_units, final_store = self.unit_points(), self.stored_points()
        self.refresh_roles()
        self.checker.check_one_master()
        self.checker.check_tokens()
        self.checker.check_changes(final_units, final_store)
        self.checker.check_wire()
        if self.late_replies:
            self.checker.checked["replies after the sender's timeout"] = self.late_replies
        if self.missed_records:
            self.checker.checked["line records missed"] = self.missed_records
        return self.checker.summary()

    def logs_around(self, moment: float, before: float = 3.0, after: float = 1.0) -> list[str]:
        """Every instance's lines read within [moment - before, moment + after]."""
        lines = []
        with self._roles:
            agents = [*self.former, *self.agents.values()]
        for agent in agents:
            for at, line in agent.stamped:
                if moment - before <= at <= moment + after:
                    lines.append((at, f"{at:.3f} {agent.name}: {line.rstrip()}"))
        return [text for _, text in sorted(lines)]

    def timeline(
        self, slot: int, moment: float, before: float = 4.0, after: float = 1.0
    ) -> list[str]:
        """What the checker knows of one unit within [moment - before, moment + after]: its
        panel changes and writes, the transactions addressed to it, the store's writes of
        its points' keys, and the lock's grants."""
        low, high = moment - before, moment + after
        keys = {point_key(slot, point).encode() for point in self.kept}
        lock = self.lock_key.encode()
        rows: list[tuple[float, str]] = []
        for unit_event in self.checker.units:
            if unit_event.address == slot and low <= unit_event.at <= high:
                what = f"unit {unit_event.kind} {_point_shown(unit_event.point)}"
                rows.append((unit_event.at, f"{what}{unit_event.value}"))
        for line_event in self.checker.line:
            if line_event.address == slot and low <= line_event.at <= high:
                rows.append(
                    (
                        line_event.at,
                        f"line {line_event.client} {line_event.kind}"
                        + (f" {line_event.value}" if line_event.value is not None else "")
                        + f" (to {line_event.ended or line_event.at:.3f})",
                    )
                )
        for event in self.checker.store:
            if (event.key in keys or event.key == lock) and low <= event.at <= high:
                rows.append(
                    (
                        event.at,
                        f"store {event.client} {event.command} {event.key.decode()} "
                        f"{(event.value or b'').decode(errors='replace')} ft={event.token} "
                        f"{'ok' if event.accepted else 'refused'} v={event.version}",
                    )
                )
        for wiped in self.checker.wiped_at:
            if low <= wiped <= high:
                rows.append((wiped, "store wiped"))
        return [f"{at:.3f} {text}" for at, text in sorted(rows)]

    def write_logs(self, directory: Path) -> None:
        """Every instance's lines, each with when it was read (monotonic), one file each."""
        directory.mkdir(parents=True, exist_ok=True)
        with self._roles:
            agents = [*self.former, *self.agents.values()]
        for index, agent in enumerate(agents):
            path = directory / f"{agent.name}-{index:02d}-pid{agent.process.proc.pid}.log"
            path.write_text("".join(f"{at:.3f} {line}" for at, line in agent.stamped))
        # What the checker was fed, one event a line, for a look after the run.
        with (directory / "store.txt").open("w") as out:
            for event in self.checker.store:
                out.write(
                    f"{event.at:.3f} {event.client} {event.command} {event.key.decode()} "
                    f"{(event.value or b'').decode(errors='replace')} ft={event.token} "
                    f"px={event.expiry_ms} {'ok' if event.accepted else 'refused'} "
                    f"v={event.version}\n"
                )
        with (directory / "line.txt").open("w") as out:
            for e in self.checker.line:
                sent = e.at if e.sent is None else e.sent
                ended = e.at if e.ended is None else e.ended
                out.write(
                    f"{e.at:.3f} {e.client} {e.address} {e.kind} {e.value} sent={sent:.3f} "
                    f"ended={ended:.3f}{' COLLISION' if e.collision else ''}\n"
                )
        with (directory / "units.txt").open("w") as out:
            for unit_event in sorted(self.checker.units, key=lambda e: e.at):
                out.write(
                    f"{unit_event.at:.3f} s{unit_event.address:02d} {unit_event.kind} "
                    f"{_point_shown(unit_event.point)}{unit_event.value}\n"
                )

    def close(self) -> None:
        with self._roles:
            agents = list(self.agents.values())
        for agent in agents:
            if agent.stopped:
                agent.process.signal(signal.SIGCONT)
                agent.stopped = False
            agent.expected_exit = True
            self._read(agent)
            agent.process.stop()
            self.background.run(agent.proxy.stop())
        self.client.close()
        self.background.run(self.line.stop())
        self.store_up = False
        self.background.run(self.store.stop())
        self.background.close()
