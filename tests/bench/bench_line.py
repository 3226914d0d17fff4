"""Figures for one agent serving a whole line, each beside its bound measured in the same run.

(Transactions and the poll cycle beside their line time, for both protocols and every kind
of port: bench_line_speed; the write path beside its floor and a peer: bench_write_path.)

    python -m tests.bench.bench_line [--units 1,8,32,128] [--bauds 9600,19200] [--changes N]

The fake line (agent.simulator.line) runs in this process with line-time emulation
at the given baud rate: one transaction at a time, each holding the line for its request's
and reply's line time (8N1). The state store is the embedded one, in this process too; the
agent is a real process, polling as fast as the line allows (poll interval 0).

For each baud rate and number of devices N:
1. Poll cycle time: the time between two polls of the same unit, from the fake line's own
   records, against its bound: N transactions' line time plus a silent interval each
   (agent.controller.timing, the request and reply sizes of a routine poll). Target <= 1.2x.
2. Resident memory (VmRSS) and CPU (utime + stime over a window) of the agent. Targets:
   RSS <= 60 MB at N = 32 and <= 80 MB at N = 128; CPU <= 2 % of a core at N = 32 and
   19200 baud.
3. Remote change -> controller read-back, while the line is busy polling: from the SET's
   publication until the active's sync record for that version arrives (written after the
   read-back), p50 and p99. Bound: 2 x (store round trip + one transaction already on the
   line + the write and its read-back), with the store round trip measured in the same run
   (paho GET, p50 / p99). Must not grow with N.
4. Panel change -> store: from the change at the unit's panel until the set point key's
   notification with that value, p99. Bound: one poll cycle (as measured in 1.) + one store
   round trip.
Then, at N = 32 and the first baud rate:
5. One dead unit among 32: cycle time and remote-change latency to the others, with and
   without it.
6. Takeover after SIGKILL of the active of a pair: from the kill until every device is
   served again (the new active's "line open" line), against TTL + 300 ms + one reconcile
   pass (its duration is in that line, and printed).
"""

from __future__ import annotations

import argparse
import itertools
import queue
import random
import re
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.controller import line_protocol as lp
from agent.controller.line_driver import POLL_REPLY_BYTES, POLL_REQUEST_BYTES
from agent.controller.timing import LineTiming, cycle_s
from tests.bench.footprint import cpu_seconds, rss_kb
from tests.bench.line_cells import ms, nodelay, quantile, store_round_trips
from tests.support.rig import ACTIVE, STANDBY, LineRig

CPU_TARGET_N32 = 0.02
RSS_TARGETS_MB = {32: 60, 128: 80}
CYCLE_FACTOR = 1.2
TOOK_OVER = re.compile(r"line open: (\d+) device\(s\) reconciled in (\d+) ms")


@dataclass
class Row:
    name: str
    measured: str
    bound: str
    met: bool | None


class BenchRig(LineRig):
    """A line rig whose fake line emulates the line time at `baud`."""

    def __init__(self, tmp_path: Path, units: int, baud: int, **options: Any) -> None:
        self.baud = baud
        super().__init__(tmp_path, units, **options)

    def _make_device(self) -> Any:
        from agent.simulator.line import FakeLine

        return FakeLine(
            units=self.units, setpoint=20.0, time_constant_s=30.0, emulate_baud=self.baud
        )

    def agent_env(self) -> dict[str, str]:
        return {
            "AGENT_SERIAL__BAUDRATE": str(self.baud),
            "AGENT_SERIAL__POLL_INTERVAL_S": "0.001",  # as fast as the line allows
            "AGENT_SERIAL__MIN_WRITE_INTERVAL_S": "0",
            "AGENT_TELEMETRY__INTERVAL_S": "10",
            "AGENT_LOG_LEVEL": "INFO",
        }


def measured_cycles(rig: LineRig, address: int, since: float) -> list[float]:
    """Times between successive routine polls of one unit, from the fake line's records."""

    def polls() -> list[float]:
        return [
            r.at
            for r in rig.device.records
            if r.address == address and r.kind == "GET STATE" and r.at >= since
        ]

    stamps = rig.background.call(polls)
    return [b - a for a, b in itertools.pairwise(stamps)]


class Notes:
    """Store notifications with their arrival times (the rig's paho client's queue)."""

    def __init__(self, rig: LineRig) -> None:
        self.rig = rig
        self.stamped: queue.Queue[tuple[float, Any]] = queue.Queue()
        outer = self

        class Stamped(queue.Queue[Any]):
            def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
                outer.stamped.put((time.monotonic(), item))

        rig.client.notifications = Stamped()  # type: ignore[assignment]

    def clear(self) -> None:
        while not self.stamped.empty():
            self.stamped.get_nowait()

    def wait(self, predicate: Callable[[Any], bool], timeout: float = 30.0) -> float:
        deadline = time.monotonic() + timeout
        while True:
            stamp, note = self.stamped.get(timeout=max(0.0, deadline - time.monotonic()))
            if predicate(note):
                return stamp


def remote_latencies(rig: LineRig, notes: Notes, count: int, skip: set[int]) -> list[float]:
    """Remote change -> the active's sync record of that version."""
    addresses = [n for n in range(1, rig.units + 1) if n not in skip]
    for n in addresses:
        rig.client.request("KEYNOTIFY", f"t{n:02d}\\synced")
    latencies = []
    rng = random.Random(7)
    for index in range(count):
        address = rng.choice(addresses)
        value = 21.5 if index % 2 == 0 else 22.0
        key = f"t{address:02d}\\setPoint"
        lock = rig.client.request("GET", f"{rig.LINE}\\lock").prop("__ts")
        notes.clear()
        started = time.monotonic()
        reply = rig.client.request("SET", key, lp.format_number(value), ft=lock)
        assert reply.payload == b"+OK\r\n", reply.payload
        version = reply.prop("__ts")
        record = f"t{address:02d}\\synced".encode().hex().upper()

        def recorded(note: Any, record: str = record, version: Any = version) -> bool:
            return note.topic.endswith(record) and f'"version":"{version}"'.encode() in (
                note.payload
            )

        done = notes.wait(recorded)
        latencies.append(done - started)
        time.sleep(0.02)
    return latencies


def panel_latencies(rig: LineRig, notes: Notes, count: int) -> list[float]:
    for n in range(1, rig.units + 1):
        rig.client.request("KEYNOTIFY", f"t{n:02d}\\setPoint")
    latencies = []
    rng = random.Random(11)
    for index in range(count):
        address = rng.randrange(1, rig.units + 1)
        value = 18.0 + (index % 10) * 0.5
        if rig.background.call(lambda a=address: rig.unit(a).setpoint) == value:
            value += 5.0
        notes.clear()
        time.sleep(rng.uniform(0, 0.05))  # at any point of the cycle
        started = time.monotonic()
        rig.background.call(lambda a=address, v=value: rig.unit(a).panel_setpoint(v))
        key = f"t{address:02d}\\setPoint".encode().hex().upper()
        text = lp.format_number(value).encode()

        def published(note: Any, key: str = key, text: bytes = text) -> bool:
            return note.topic.endswith(key) and note.payload.endswith(text + b"\r\n")

        done = notes.wait(published)
        latencies.append(done - started)
    return latencies


def bench_line(directory: Path, units: int, baud: int, changes: int) -> list[Row]:
    rig = BenchRig(directory, units, baud)
    rows: list[Row] = []
    try:
        nodelay(rig)
        agent, _ = rig.start_active("a", **rig.agent_env())
        notes = Notes(rig)
        time.sleep(1.0)  # warm-up: the first cycles behind us
        since = time.monotonic()
        cpu_before, window_start = cpu_seconds(agent.proc.pid), time.monotonic()
        time.sleep(max(5.0, 3 * units * 0.08))
        cpu_share = (cpu_seconds(agent.proc.pid) - cpu_before) / (time.monotonic() - window_start)
        rss = rss_kb(agent.proc.pid) / 1024
        cycles = measured_cycles(rig, 1, since)
        timing = LineTiming(baud, 10, turnaround_s=0.0)
        bound_cycle = cycle_s(timing, units, POLL_REQUEST_BYTES, POLL_REPLY_BYTES)
        cycle = statistics.median(cycles)
        rtts = store_round_trips(rig, 50)
        remote = remote_latencies(rig, notes, changes, skip=set())
        panel = panel_latencies(rig, notes, max(10, changes // 2))
        rtts += store_round_trips(rig, 50)
    finally:
        rig.close()
    label = f"N={units:>3} {baud:>5} Bd"
    rows.append(
        Row(
            f"{label} poll cycle (median of {len(cycles)})",
            ms(cycle),
            f"{CYCLE_FACTOR}x {ms(bound_cycle)} = {ms(CYCLE_FACTOR * bound_cycle)}",
            cycle <= CYCLE_FACTOR * bound_cycle,
        )
    )
    rss_target = RSS_TARGETS_MB.get(units)
    rows.append(
        Row(
            f"{label} RSS",
            f"{rss:.1f} MB",
            f"<= {rss_target} MB" if rss_target else "",
            None if rss_target is None else rss <= rss_target,
        )
    )
    cpu_bound = units == 32 and baud == 19200
    rows.append(
        Row(
            f"{label} CPU, polling flat out",
            f"{cpu_share * 100:.2f} %",
            "<= 2 % of a core" if cpu_bound else "",
            cpu_share <= CPU_TARGET_N32 if cpu_bound else None,
        )
    )
    # One transaction already on the line, then the write and its read-back: the longest
    # line-protocol exchange (a state reply) stands for each.
    transaction = timing.transaction_s(POLL_REQUEST_BYTES, POLL_REPLY_BYTES)
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        rtt = quantile(rtts, q)
        bound = 2 * (rtt + 3 * transaction)
        value = quantile(remote, q)
        rows.append(
            Row(f"{label} remote change -> read-back {name}", ms(value), ms(bound), value <= bound)
        )
    p99 = quantile(panel, 0.99)
    bound_panel = cycle + quantile(rtts, 0.99)
    rows.append(
        Row(f"{label} panel change -> store p99", ms(p99), ms(bound_panel), p99 <= bound_panel)
    )
    # A change made just after its unit was read is read one cycle later, and the reading
    # arrives at the end of that poll's transaction: the bound above leaves that out.
    with_poll = bound_panel + transaction
    rows.append(
        Row(
            f"{label}   ... against cycle + the poll's own transaction + RTT",
            ms(p99),
            ms(with_poll),
            p99 <= with_poll,
        )
    )
    return rows


def bench_dead_unit(directory: Path, baud: int, changes: int) -> list[Row]:
    rows = []
    for dead in (False, True):
        rig = BenchRig(directory / f"dead-{dead}", 32, baud)
        try:
            nodelay(rig)
            rig.start_active("a", **rig.agent_env())
            notes = Notes(rig)
            if dead:
                rig.background.call(lambda rig=rig: rig.unit(16).fault("SILENT", 3600))
            time.sleep(3.0)
            since = time.monotonic()
            time.sleep(4.0)
            cycle = statistics.median(measured_cycles(rig, 1, since))
            remote = remote_latencies(rig, notes, changes, skip={16})
        finally:
            rig.close()
        what = "unit 16 dead" if dead else "all answering"
        rows.append(Row(f"N=32 {baud} Bd, {what}: poll cycle", ms(cycle), "", None))
        rows.append(
            Row(f"N=32 {baud} Bd, {what}: remote change p50", ms(quantile(remote, 0.5)), "", None)
        )
        rows.append(
            Row(f"N=32 {baud} Bd, {what}: remote change p99", ms(quantile(remote, 0.99)), "", None)
        )
    return rows


def bench_takeover(directory: Path, baud: int, rounds: int, ttl_ms: int) -> list[Row]:
    rig = BenchRig(directory, 32, baud, ttl_ms=ttl_ms)
    results: list[tuple[float, float]] = []
    try:
        env = rig.agent_env()
        names = ["a", "b"]
        active, _ = rig.start_active(names[0], **env)
        standby = rig.start_agent(names[1], **env)
        standby.wait_for_new(STANDBY)
        for _ in range(rounds):
            time.sleep(1.0)
            killed = time.monotonic()
            active.signal(signal.SIGKILL)
            match = standby.wait_for_new(TOOK_OVER, timeout=ttl_ms / 1000 + 30)
            served = time.monotonic() - killed
            standby.wait_for_new(ACTIVE)
            results.append((served, int(match.group(2)) / 1000))
            active.stop()
            names.reverse()
            active = standby
            standby = rig.start_agent(names[1], **env)
            standby.wait_for_new(STANDBY)
    finally:
        rig.close()
    rows = []
    for index, (served, reconcile) in enumerate(results):
        bound = ttl_ms / 1000 + 0.3 + reconcile
        rows.append(
            Row(
                f"takeover {index + 1}: whole line served again (reconcile pass {ms(reconcile)})",
                ms(served),
                f"TTL+300+pass = {ms(bound)}",
                served <= bound,
            )
        )
    return rows


def print_table(title: str, rows: list[Row]) -> None:
    print(f"\n{title}", flush=True)
    width = max(len(row.name) for row in rows)
    for row in rows:
        verdict = "" if row.met is None else ("met" if row.met else "NOT MET")
        bound = f"bound {row.bound}" if row.bound else ""
        print(f"  {row.name:<{width}}  {row.measured:>10}  {bound:<34} {verdict}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--units", default="1,8,32,128")
    parser.add_argument("--bauds", default="9600,19200")
    parser.add_argument("--changes", type=int, default=40, help="remote changes per setup")
    parser.add_argument("--rounds", type=int, default=3, help="takeovers")
    parser.add_argument("--ttl-ms", type=int, default=3000)
    parser.add_argument("--skip-pair", action="store_true")
    args = parser.parse_args()
    units = [int(u) for u in args.units.split(",")]
    bauds = [int(b) for b in args.bauds.split(",")]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-line-") as tmp:
        directory = Path(tmp)
        for baud in bauds:
            rows: list[Row] = []
            for n in units:
                rows += bench_line(directory / f"{baud}-{n}", n, baud, args.changes)
            print_table(f"One line at {baud} baud, line time emulated (8N1)", rows)
        if not args.skip_pair:
            print_table(
                f"One dead unit among 32 at {bauds[0]} baud",
                bench_dead_unit(directory / "dead", bauds[0], args.changes),
            )
            print_table(
                f"Takeover of a 32-device line after SIGKILL (TTL {args.ttl_ms} ms)",
                bench_takeover(directory / "takeover", bauds[0], args.rounds, args.ttl_ms),
            )
    print(f"\ntotal {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
