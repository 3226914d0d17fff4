"""A soak run: a pair serving a line under random faults, checked throughout.

    python tests/soak/run.py --seconds 60 --seed 1 [--units 4] [--ttl-ms 3000]

Everything runs on this machine: the embedded state store (kept on disk, so that a restart
can keep or lose its contents) and the fake line (TCP, as a serial device server shares it
with the pair) in this process, the two agents as real processes, each reaching the broker
through a fault proxy of its own. A driver makes remote changes (fenced with the line's
lock, as `agent setpoint` does) and panel changes at random, while faults are injected one
at a time from this catalogue (seeded, so a run can be repeated):

    kill, term, pause          the active, or the standby (SIGKILL, SIGTERM, SIGSTOP/SIGCONT)
    cut, blackhole, delay      an agent's link to the broker (the proxy)
    broker_restart             the broker restarts, the store keeping its contents (on disk)
    broker_restart_forget      the store restarts without them (the lock and keys vanish)
    unit_silent, unit_garbage  one unit stops answering, or answers garbage
    line_unplug                the whole line goes away and comes back

The checker (tests/soak/checker.py) is fed by the fake line's own records and by a hook on
the store, never by the agents. When the time is up the faults stop, and every device must
come to agree. The last line printed is one JSON object: the faults injected by kind,
violations (target 0), changes lost (target 0), recovery times per fault kind (p50/p99:
from the end of a fault until an instance holds the lease and drives the line) and the
changes made.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.emulator.embedded import EmbeddedStateStore
from agent.simulator.line import FakeLine
from tests.harness.proxy import FaultProxy
from tests.soak.checker import Checker, LineEvent, UnitEvent
from tests.support.paho_client import PahoStoreClient
from tests.support.ports import free_port
from tests.support.processes import AgentProcess
from tests.support.rig import RECORD_OF_20, BackgroundLoop
from tests.support.store_watch import watch_writes

LINE = "soak"
ACTIVE = re.compile(r"became active")
STEPPED_DOWN = re.compile(r"stepped down to standby")
VALUES = [n / 2 for n in range(30, 60)]  # 15.0 .. 29.5, on the controllers' grid
PROBE_S = 2.0


def device_id(address: int) -> str:
    return f"s{address:02d}"


@dataclass
class Agent:
    name: str
    process: AgentProcess
    proxy: FaultProxy
    stopped: bool = False  # SIGSTOPped by the harness
    expected_exit: bool = False  # ended by the harness
    active: bool = False
    read_lines: int = 0


@dataclass
class Stats:
    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    recovery: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    changes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    died: list[str] = field(default_factory=list)
    not_recovered: list[str] = field(default_factory=list)


class World:
    def __init__(self, directory: Path, units: int, ttl_ms: int, rng: random.Random) -> None:
        self.directory = directory
        self.units = units
        self.ttl_ms = ttl_ms
        self.rng = rng
        self.background = BackgroundLoop()
        self.port = free_port()
        self.data_dir = directory / "store"
        self.checker = Checker(
            {n: device_id(n) for n in range(1, units + 1)}, f"{LINE}\\lock".encode()
        )
        self.store = self._start_store(keep=True)
        self.line = FakeLine(units=units, setpoint=20.0, time_constant_s=30.0)
        self.background.run(self.line.start(tcp_port=0, panel_port=0))
        self.background.call(self._seed)
        self.agents: dict[str, Agent] = {}
        self.client = PahoStoreClient("127.0.0.1", self.port, "soak-driver")
        self._line_seq = 0
        self._unit_seen: dict[tuple[int, str], float] = {}
        self.stats = Stats()

    # ------------------------------------------------------------------ the store

    def _start_store(self, *, keep: bool) -> EmbeddedStateStore:
        if not keep:
            for file in self.data_dir.glob("*"):
                file.unlink()
        store = EmbeddedStateStore("127.0.0.1", self.port, data_dir=self.data_dir)
        self._hook(store)
        self.background.run(store.start())
        return store

    def _hook(self, store: EmbeddedStateStore) -> None:
        watch_writes(store.store, self.checker.store.append)

    def _seed(self) -> None:
        for n in range(1, self.units + 1):
            now = f"{time.time_ns() // 1_000_000:015d}:00000:seed"
            payload = b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
                len(f"{device_id(n)}\\synced"),
                f"{device_id(n)}\\synced".encode(),
                len(RECORD_OF_20),
                RECORD_OF_20,
            )
            self.store.store.handle("seed", payload, now, None)

    def restart_store(self, *, keep: bool, outage_s: float) -> None:
        self.background.run(self.store.stop())
        if not keep:
            self.checker.wiped_at.append(time.monotonic())
        time.sleep(outage_s)  # the outage is the fault itself
        self.store = self._start_store(keep=keep)
        self.client.close()
        self.client = PahoStoreClient("127.0.0.1", self.port, f"soak-driver-{time.monotonic_ns()}")

    # ------------------------------------------------------------------ agents

    def start_agent(self, name: str) -> Agent:
        proxy = FaultProxy(("127.0.0.1", self.port))
        self.background.run(proxy.start())
        env = {
            "AGENT_LINE_ID": LINE,
            "AGENT_DEVICES": ",".join(f"{device_id(n)}@{n}" for n in range(1, self.units + 1)),
            "AGENT_INSTANCE_ID": name,
            "AGENT_STATE_DIR": str(self.directory / f"state-{name}"),
            "AGENT_MQTT__HOST": "127.0.0.1",
            "AGENT_MQTT__PORT": str(proxy.port),
            "AGENT_MQTT__KEEPALIVE_S": "2",
            "AGENT_MQTT__RECONNECT_MIN_S": "0.1",
            "AGENT_MQTT__RECONNECT_MAX_S": "2",
            "AGENT_MQTT__REQUEST_TIMEOUT_S": "2",
            "AGENT_SERIAL__URL": str(self.line.tcp_url),
            "AGENT_SERIAL__POLL_INTERVAL_S": "0.2",
            "AGENT_SERIAL__MIN_WRITE_INTERVAL_S": "0.2",
            "AGENT_SERIAL__PROBE_INTERVAL_S": str(PROBE_S),
            "AGENT_LOCK__TTL_MS": str(self.ttl_ms),
            "AGENT_TELEMETRY__INTERVAL_S": "5",
            "AGENT_LOG_LEVEL": "INFO",
        }
        process = AgentProcess([], env=env, merge_stderr=True)
        agent = Agent(name, process, proxy)
        old = self.agents.get(name)
        if old is not None:
            self.background.run(old.proxy.stop())
        self.agents[name] = agent
        return agent

    def refresh_roles(self) -> None:
        for agent in self.agents.values():
            if not agent.stopped:
                agent.process.drain()
            for line in agent.process.lines[agent.read_lines :]:
                if ACTIVE.search(line):
                    agent.active = True
                elif STEPPED_DOWN.search(line):
                    agent.active = False
            agent.read_lines = len(agent.process.lines)
            code = agent.process.proc.poll()
            if code is not None:
                agent.active = False
                if not agent.expected_exit and agent.name not in self.stats.died:
                    tail = "".join(agent.process.lines[-5:])
                    self.stats.died.append(f"{agent.name} exited {code}: {tail}")

    def active(self) -> Agent | None:
        self.refresh_roles()
        live = [a for a in self.agents.values() if a.active and not a.stopped]
        return live[0] if live else None

    def lock_holder(self) -> str | None:
        entry = self.background.call(lambda: self.store.store.entry(f"{LINE}\\lock".encode()))
        return None if entry is None else entry.value.decode(errors="replace").split("#")[0]

    def driving(self) -> bool:
        """An instance holds the lease and drives the line."""
        agent = self.active()
        return agent is not None and self.lock_holder() == agent.name

    def driving_since(self, moment: float) -> bool:
        """An active instance holds the lease by a grant or renewal of the store's after
        `moment` (it is back, not just still named in the store)."""
        agent = self.active()
        if agent is None:
            return False
        lock = f"{LINE}\\lock".encode()
        holder = agent.name.encode()
        return any(
            event.key == lock
            and event.accepted
            and event.at > moment
            and (event.value or b"").split(b"#")[0] == holder
            for event in reversed(self.checker.store)
        )

    def line_answered_since(self, address: int | None, moment: float) -> bool:
        def answered() -> bool:
            return any(
                r.at > moment and r.answered and (address is None or r.address == address)
                for r in self.line.records
            )

        return bool(self.background.call(answered))

    # ------------------------------------------------------------------ the line's records

    def collect(self) -> None:
        def take() -> tuple[list[Any], list[tuple[int, str, float, float]]]:
            records = self.line.records_since(self._line_seq)
            units = []
            for unit in self.line.units:
                assert unit.address is not None
                for kind, items in (("panel", unit.panel_changes), ("write", unit.writes)):
                    for item in items:
                        units.append((unit.address, kind, item.at, item.value))
            return records, units

        records, units = self.background.call(take)
        for record in records:
            self._line_seq = max(self._line_seq, record.seq)
            self.checker.line.append(
                LineEvent(
                    record.at,
                    record.client,
                    record.address,
                    record.kind,
                    record.value,
                    record.other_client is not None,
                )
            )
        for address, kind, at, value in units:
            key = (address, kind)
            if at > self._unit_seen.get(key, float("-inf")):
                self.checker.units.append(UnitEvent(at, address, kind, value))
        for address in range(1, self.units + 1):
            for kind in ("panel", "write"):
                seen = [e.at for e in self.checker.units if e.address == address and e.kind == kind]
                if seen:
                    self._unit_seen[(address, kind)] = max(seen)

    def unit_setpoints(self) -> dict[int, float]:
        return self.background.call(
            lambda: {n: self.line.unit(n).setpoint for n in range(1, self.units + 1)}
        )

    def stored_setpoints(self) -> dict[int, bytes | None]:
        def read() -> dict[int, bytes | None]:
            entries = {
                n: self.store.store.entry(f"{device_id(n)}\\setPoint".encode())
                for n in range(1, self.units + 1)
            }
            return {n: None if e is None else e.value for n, e in entries.items()}

        return self.background.call(read)

    def settle_and_check(self) -> dict[str, Any]:
        """Once faults stop: waits for every controller and its set point key to agree,
        then runs the checker over everything recorded; its summary."""

        def agree() -> bool:
            units, stored = self.unit_setpoints(), self.stored_setpoints()
            return all((value := stored[n]) is not None and float(value) == units[n] for n in units)

        wait_until(agree, 10 * self.ttl_ms / 1000 + 20, step=0.2)
        self.collect()
        final_units, final_store = self.unit_setpoints(), self.stored_setpoints()
        self.refresh_roles()
        self.checker.check_one_master()
        self.checker.check_tokens()
        self.checker.check_changes(final_units, final_store)
        return self.checker.summary()

    def close(self) -> None:
        for agent in self.agents.values():
            if agent.stopped:
                agent.process.signal(signal.SIGCONT)
            agent.expected_exit = True
            agent.process.stop()
            self.background.run(agent.proxy.stop())
        self.client.close()
        self.background.run(self.line.stop())
        self.background.run(self.store.stop())
        self.background.close()


# ---------------------------------------------------------------------------- faults


# How often each fault is picked, relatively.
FAULT_WEIGHTS: dict[str, int] = {
    "kill": 3,
    "term": 2,
    "pause": 2,
    "cut": 2,
    "blackhole": 2,
    "delay": 1,
    "broker_restart": 2,
    "broker_restart_forget": 1,
    "unit_silent": 1,
    "unit_garbage": 1,
    "line_unplug": 1,
}


class Faults:
    def __init__(self, world: World) -> None:
        self.world = world
        self.rng = world.rng
        self.ttl_s = world.ttl_ms / 1000

    def pick(self) -> str:
        kinds = list(FAULT_WEIGHTS)
        return self.rng.choices(kinds, weights=[FAULT_WEIGHTS[k] for k in kinds])[0]

    def inject(self, kind: str) -> tuple[float, int | None]:
        """Carries out one fault; returns when it ended (monotonic), and the unit it hit."""
        world = self.world
        target = self._target()
        if kind in ("kill", "term"):
            target.expected_exit = True
            target.process.signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
            target.process.proc.wait(15)
            ended = time.monotonic()
            self._restart_later(target.name)
            return ended, None
        if kind == "pause":
            target.stopped = True
            target.process.signal(signal.SIGSTOP)
            time.sleep(self.rng.uniform(0.5, 2.5) * self.ttl_s)
            target.process.signal(signal.SIGCONT)
            target.stopped = False
            return time.monotonic(), None
        if kind in ("cut", "blackhole", "delay"):
            proxy = target.proxy
            if kind == "cut":
                world.background.call(proxy.cut)
                time.sleep(self.rng.uniform(0.2, 1.5))
            elif kind == "blackhole":
                world.background.call(proxy.blackhole)
                time.sleep(self.rng.uniform(0.5, 2.0) * self.ttl_s)
            else:
                delay = self.rng.uniform(0.1, 0.4) * self.ttl_s
                world.background.call(lambda: proxy.delay(delay))
                time.sleep(self.rng.uniform(1, 3) * self.ttl_s)
            world.background.call(proxy.set_pass)
            return time.monotonic(), None
        if kind in ("broker_restart", "broker_restart_forget"):
            world.restart_store(keep=kind == "broker_restart", outage_s=self.rng.uniform(0.2, 2.0))
            return time.monotonic(), None
        address = self.rng.randrange(1, world.units + 1)
        unit = world.line.unit(address)
        if kind == "unit_silent":
            seconds = self.rng.uniform(1, 5)
            world.background.call(lambda: unit.fault("SILENT", seconds))
            time.sleep(seconds)
        elif kind == "unit_garbage":
            world.background.call(lambda: unit.fault("GARBAGE", self.rng.randrange(1, 5)))
        else:  # line_unplug
            seconds = self.rng.uniform(0.5, 3)
            world.background.call(lambda: world.line.fault("UNPLUG", seconds))
            time.sleep(seconds)
            return time.monotonic(), 0
        return time.monotonic(), address

    def _target(self) -> Agent:
        world = self.world
        active = world.active()
        standby = [
            a for a in world.agents.values() if a is not active and a.process.proc.poll() is None
        ]
        if active is not None and (not standby or self.rng.random() < 0.7):
            return active
        return standby[0] if standby else next(iter(world.agents.values()))

    def _restart_later(self, name: str) -> None:
        # Back as the standby after a while: the pair is whole again before the next fault.
        time.sleep(self.rng.uniform(0.2, 1.0))
        self.world.start_agent(name)


# ---------------------------------------------------------------------------- the driver


class Driver:
    def __init__(self, world: World) -> None:
        self.world = world
        self.rng = world.rng
        self.recent: dict[int, list[float]] = defaultdict(list)

    def _value(self, address: int) -> float:
        recent = self.recent[address]
        value = self.rng.choice([v for v in VALUES if v not in recent])
        recent.append(value)
        del recent[:-8]
        return value

    def change(self) -> None:
        world = self.world
        address = self.rng.randrange(1, world.units + 1)
        value = self._value(address)
        if self.rng.random() < 0.5:
            unit = world.line.unit(address)
            world.background.call(lambda: unit.panel_setpoint(value))
            world.stats.changes["panel"] += 1
            return
        try:
            lock = world.client.request("GET", f"{LINE}\\lock")
            token = lock.prop("__ts")
            if lock.payload == b"$-1\r\n" or token is None:
                world.stats.changes["remote_no_active"] += 1
                return
            reply = world.client.request(
                "SET", f"{device_id(address)}\\setPoint", f"{value:.1f}", ft=token
            )
        except Exception:
            world.stats.changes["remote_failed"] += 1
            return
        if reply.payload == b"+OK\r\n":
            world.stats.changes["remote"] += 1
        else:
            world.stats.changes["remote_refused"] += 1


# ---------------------------------------------------------------------------- the run


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def wait_until(predicate: Any, timeout: float, step: float = 0.05) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(step)
    return None


def run(seconds: float, seed: int, units: int, ttl_ms: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        world = World(Path(tmp), units, ttl_ms, rng)
        try:
            world.start_agent("a")
            assert wait_until(world.driving, 30), "no active at start"
            world.start_agent("b")
            faults, driver = Faults(world), Driver(world)
            ttl_s = ttl_ms / 1000
            ends_at = time.monotonic() + seconds
            next_fault = time.monotonic() + rng.uniform(1, 3) * ttl_s
            while time.monotonic() < ends_at:
                driver.change()
                world.collect()
                if time.monotonic() >= next_fault:
                    kind = faults.pick()
                    world.stats.faults[kind] += 1
                    ended, unit = faults.inject(kind)
                    # Liveness: an instance holds the lease (granted or renewed since the
                    # fault ended) and drives, within TTL + 300 ms (a store that forgot its
                    # lock adds the lock delay: one more TTL). A unit's fault ends when it
                    # answers again (0: the whole line).
                    bound = ttl_s + 0.3 + (ttl_s if kind == "broker_restart_forget" else 0)
                    if unit is not None:
                        # A quarantined unit is probed after PROBE_S, then twice as late.
                        bound = 3 * PROBE_S + 0.3
                    if unit is None:
                        took = wait_until(
                            lambda ended=ended: world.driving_since(ended), bound + 30
                        )
                    else:
                        address = None if unit == 0 else unit
                        took = wait_until(
                            lambda a=address, e=ended: world.line_answered_since(a, e), bound + 30
                        )
                    recovered = time.monotonic() - ended if took is not None else None
                    if recovered is None or recovered > bound:
                        world.stats.not_recovered.append(
                            f"{kind}: {'never' if recovered is None else f'{recovered:.2f} s'} "
                            f"(bound {bound:.2f} s)"
                        )
                    if recovered is not None:
                        world.stats.recovery[kind].append(recovered)
                    next_fault = time.monotonic() + rng.uniform(1, 2) * ttl_s
                time.sleep(rng.uniform(0.1, 0.6))

            summary = world.settle_and_check()
        finally:
            world.close()
    stats = world.stats
    violations = summary["violations"] + len(stats.died) + len(stats.not_recovered)
    return {
        "seconds": seconds,
        "seed": seed,
        "units": units,
        "ttl_ms": ttl_ms,
        "faults": dict(stats.faults),
        "violations": violations,
        "violations_by_kind": {
            **summary["violations_by_kind"],
            **({"process_died": len(stats.died)} if stats.died else {}),
            **({"not_recovered_in_time": len(stats.not_recovered)} if stats.not_recovered else {}),
        },
        "lost": summary["lost"],
        "raced_panel_changes": summary["raced_panel_changes"],
        "recovery_ms": {
            kind: {
                "p50": round(quantile(values, 0.5) * 1000),
                "p99": round(quantile(values, 0.99) * 1000),
                "n": len(values),
            }
            for kind, values in sorted(stats.recovery.items())
        },
        "changes": dict(stats.changes),
        "details": summary["first_violations"] + stats.died[:5] + stats.not_recovered[:5],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--units", type=int, default=4)
    parser.add_argument("--ttl-ms", type=int, default=3000)
    args = parser.parse_args()
    result = run(args.seconds, args.seed, args.units, args.ttl_ms)
    for kind, count in sorted(result["faults"].items()):
        recovery = result["recovery_ms"].get(kind)
        shown = f"recovery p50 {recovery['p50']} ms, p99 {recovery['p99']} ms" if recovery else ""
        print(f"  {kind:<24} {count:>4}  {shown}", flush=True)
    for detail in result["details"]:
        print(f"  ! {detail}", flush=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
