"""A whole thermostat: a line of units with the built-in profile `sim`, beside the same line
with set points only.

    python -m tests.bench.bench_thermostat [--protocols line,modbus] [--baud 9600]
        [--units 32] [--modes fast,1s] [--changes 60] [--window-s 65] [--wait-s 60]
        [--points setPoint,heatSetPoint,mode]

For each protocol and poll mode, two runs on the same kind of line, one after the other: the
devices `t01`..`tNN` with `"profile": "sim"` (six points the agent writes: setPoint,
heatSetPoint, coolSetPoint, mode, fan, occupied; temperature and humidity read), then the same
devices with their set point alone. Each run: a fresh fake line in this process emulating the
line time (each unit's turnaround 5 ms, what the agent's computed cycle counts), the embedded
store, the agent as a real process. Modes: `fast` polls as fast as the line allows (a 1 ms
interval), `1s` at the default interval of 1 s.

Poll cycle (fast only): the time between two rounds of polls of the same unit (median, over a
quiet window of a few cycles), beside the cycle's line time the agent computes at start and logs
(agent.runtime.line.line_cycle_s: a unit with a profile costs its block read, GET POINTS or
one read of registers 0..7) and beside the fake line's own (N consecutive polls' line time).
Bound for the profile: 1.2x the computed cycle.

Remote change to read-back on the unit, as bench_write_path measures it (from just before
the SET of `t<NN>\\<point>` to the end of the read-back on the line: Modbus reads the register
after its write, the line protocol's `OK <name> <value>` is its read-back), for the points
given (in turns, on random units) on the profile's line and for the set point on the other:
at least --changes of them, for at least --window-s, longer than the agent's reconcile
interval (60 s), so that every run sees its safety net compare every point of every unit.
Bound: the profile's p99 <= 1.1x the set point alone's p99, same protocol and mode, and no
change lost (not written within --wait-s). Beside it, the floor of each run's sequence (store
round trip, the poll on the line, the read before the write, the write and the read-back,
each at the line time the fake line held it in that run: a unit with a profile is read whole
before a write, and a longer read costs line time), and the times the agent found its line
lost and reopened it (from its log).

Also: the agent's RSS at the end of each run (bound 60 MB for the profile at N = 32) and its
peak, its CPU on the quiet line and during the changes, and what the line carried at the
takeover before the first plain poll cycle (N polls in a row, each of another unit): the
measuring starts after it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.controller.driver import Driver, Unit
from agent.controller.interface import PointValue
from agent.controller.line_driver import LineDriver
from agent.controller.modbus_driver import ModbusDriver
from agent.controller.sim_profile import SIM
from agent.runtime.line import line_cycle_s
from agent.simulator.line import RequestRecord
from tests.bench.bench_write_path import READ_KINDS, Change, Run
from tests.bench.footprint import rss_kb
from tests.bench.line_cells import (
    FAST_POLL_S,
    PROTOCOLS,
    WRITE_KINDS,
    Cell,
    CellRig,
    Table,
    cpu_time,
    load_average,
    median,
    ms,
    nodelay,
    parse_list,
    quantile,
    store_round_trips,
    summary,
    transaction_line_s,
)
from tests.support.points_rig import WRITABLE, text
from tests.support.processes import AgentProcess
from tests.support.rig import ACTIVE, RECONCILED

CYCLE_FACTOR = 1.2
LATENCY_FACTOR = 1.1
RSS_BOUND_MB = 60.0
RSS_BOUND_UNITS = 32
POLLS = frozenset({"GET STATE", "GET POINTS", "READ HOLDING"})
READS = READ_KINDS | {"GET POINTS"}
LOGGED_CYCLE = re.compile(r"a poll cycle takes (\d+) ms of line time")
LINE_LOST = re.compile(r"line lost, reopening: (.*)")
RECONCILED_IN = re.compile(RECONCILED.pattern + r" in (\d+) ms")
MODES = {"fast": FAST_POLL_S, "1s": 1.0}
CANDIDATES: dict[str, tuple[PointValue, ...]] = {
    "setPoint": (21.5, 22.0, 22.5, 23.0, 24.5),
    "heatSetPoint": (18.0, 18.5, 19.0, 19.5, 17.5),
    "coolSetPoint": (25.0, 25.5, 26.0, 26.5, 27.0),
    "mode": ("cool", "auto", "heat", "off"),
    "fan": ("on", "low", "medium", "high", "auto"),
    "occupied": (False, True),
}
"""Values each point is changed to in turns: heating and cooling set points keep the
units' deadband whatever the other holds."""
assert set(CANDIDATES) == set(WRITABLE)


def computed_cycle_s(cell: Cell, profile: bool) -> float:
    """The cycle's line time as the agent computes it at start, its units with the profile
    `sim` or without one."""
    parity, stopbits = cell.framing
    options = {"baudrate": cell.baud, "parity": parity, "stopbits": stopbits}
    driver: Driver = (
        ModbusDriver("socket://127.0.0.1:1", **options)  # type: ignore[arg-type]
        if cell.modbus
        else LineDriver("socket://127.0.0.1:1", **options)  # type: ignore[arg-type]
    )
    units = [
        Unit(f"t{n:02d}", n, profile=SIM if profile else None) for n in range(1, cell.units + 1)
    ]
    return line_cycle_s(driver, units)


def hwm_kb(pid: int) -> int:
    """The process's peak resident memory so far."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


@dataclass
class Timed(Run):
    """One run: the agent on one line, its devices with the profile or without."""

    profile: bool = False
    points: list[str] = field(default_factory=list)
    """The point of each change, in the order of `changes`."""
    computed_s: float = 0.0
    logged_s: float = 0.0
    revisits: list[float] = field(default_factory=list)
    """Between two polls of the same unit, on the quiet line."""
    fake_cycles: list[float] = field(default_factory=list)
    """N consecutive polls' line time on the quiet line, as the fake line held it."""
    poll_line: float = 0.0
    """A poll's line time (median), as the fake line held it."""
    write_lines: list[float] = field(default_factory=list)
    """Each change's write and read-back, their line time as the fake line held it."""
    unanswered: int = 0
    hwm_mb: float = 0.0
    reopens: list[str] = field(default_factory=list)
    """Why the agent found its line lost and reopened it (each time)."""
    reconciled_s: float = 0.0
    """The takeover's reconciliation, as the agent logs it."""
    takeover_s: float = 0.0
    """From the line's first request to the first plain poll cycle."""
    takeover_reads: Counter[str] = field(default_factory=Counter)
    """The requests before it, by kind."""

    @property
    def what(self) -> str:
        return "profile sim" if self.profile else "set point alone"

    def floor(self) -> float:
        """Store round trip, the poll on the line, the read before the write, the write
        and the read-back (medians)."""
        return median(self.rtts) + 2 * self.poll_line + median(self.write_lines)

    def of_point(self, point: str) -> list[float]:
        return [c.latency for c, p in zip(self.changes, self.points, strict=True) if p == point]


def pick(point: str, index: int, holds: PointValue) -> PointValue:
    """The index-th value of the point's turns, another than the unit holds."""
    candidates = CANDIDATES[point]
    value = candidates[index % len(candidates)]
    if value == holds and type(value) is type(holds):
        value = candidates[(index + 1) % len(candidates)]
    return value


def held(rig: CellRig, address: int, point: str) -> PointValue:
    """What the unit holds in the point now."""
    value: PointValue = rig.background.call(lambda: rig.unit(address).point(point))
    return value


def is_write(record: RequestRecord) -> bool:
    return record.kind in WRITE_KINDS or record.kind.startswith("SET ")


def one_change(
    rig: CellRig, address: int, point: str, value: PointValue, wait_s: float
) -> tuple[Change, float] | None:
    """One remote change, fenced with the line's lock, from the line's records; and the line
    time of its write and read-back."""
    cell = rig.cell
    timing = cell.timing
    since = rig.last_seq()
    token = rig.client.request("GET", f"{rig.LINE}\\lock").prop("__ts")
    number = value if isinstance(value, float) else None
    started = time.monotonic()
    reply = rig.client.request("SET", f"t{address:02d}\\{point}", text(point, value), ft=token)
    assert reply.payload == b"+OK\r\n", reply.payload
    write = rig.wait_record(
        lambda r: (
            r.address == address
            and r.point == point
            and is_write(r)
            and (number is None or r.value == number)
        ),
        since,
        wait_s,
    )
    if write is None:
        return None
    end = write
    if cell.modbus:
        readback = rig.wait_record(
            lambda r: r.address == address and r.kind == "READ HOLDING", write.seq, 5.0
        )
        if readback is None:
            return None
        end = readback
    records = rig.background.call(lambda: rig.device.records_since(since))
    reads = [
        r
        for r in records
        if r.seq < write.seq and r.address == address and r.kind in READS and r.at >= started
    ]
    line = transaction_line_s(write, timing)
    if end is not write:
        line += transaction_line_s(end, timing)
    change = Change(
        end.ended_at - started,
        len(reads),
        reads[0].at - started if reads else None,
        write.at - reads[-1].ended_at if reads else None,
        end.at - write.ended_at if end is not write else 0.0,
    )
    return change, line


def first_plain_cycle(rig: CellRig, run: Timed, agent: AgentProcess, timeout_s: float) -> None:
    """Waits for the first plain cycle after the takeover (N polls in a row, each of
    another unit, the round going on), and notes what the line carried before it."""
    n = rig.cell.units
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = rig.records()
        polls = [r for r in records if r.kind in POLLS]
        for i in range(len(polls) - n):
            window = polls[i : i + n]
            if len({r.address for r in window}) == n and polls[i + n].address == polls[i].address:
                before = [r for r in records if r.seq < window[0].seq]
                run.takeover_s = window[0].at - records[0].at
                run.takeover_reads = Counter(r.kind for r in before)
                return
        time.sleep(0.5)
        agent.drain()  # a full pipe would stop it
    raise TimeoutError(f"no plain poll cycle within {timeout_s:.0f} s")


def revisits(polls: Sequence[RequestRecord]) -> list[float]:
    """The time between two rounds of polls of the same unit: from the start of its run
    of polls (one poll, or several in a row) to the start of its next."""
    starts: dict[int | None, float] = {}
    found: list[float] = []
    previous: int | None = None
    for record in polls:
        if record.address != previous:
            if record.address in starts:
                found.append(record.at - starts[record.address])
            starts[record.address] = record.at
        previous = record.address
    return found


def quiet_line(rig: CellRig, run: Timed, agent: AgentProcess, window_s: float) -> None:
    """The line polled without changes for `window_s`: the cycle and the agent's CPU."""
    cell = rig.cell
    pid = agent.proc.pid
    since = rig.last_seq()
    cpu0, t0 = cpu_time(pid), time.monotonic()
    while (left := t0 + window_s - time.monotonic()) > 0:
        time.sleep(min(1.0, left))
        agent.drain()
    run.cpu_quiet = (cpu_time(pid) - cpu0) / (time.monotonic() - t0)
    records = [r for r in rig.records() if r.seq > since]
    polls = [r for r in records if r.kind in POLLS]
    run.unanswered = sum(not r.answered for r in records)
    run.revisits = revisits(polls)
    n = cell.units
    lines = [transaction_line_s(r, cell.timing) for r in polls]
    run.poll_line = median(lines)
    run.fake_cycles = [sum(lines[i : i + n]) for i in range(len(lines) - n + 1)]


def measure(
    directory: Path, cell: Cell, mode: str, profile: bool, args: argparse.Namespace
) -> Timed:
    run = Timed("agent", profile=profile)
    run.computed_s = computed_cycle_s(cell, profile)
    rig = CellRig(directory, cell)
    try:
        nodelay(rig)
        env = rig.agent_env("a", MODES[mode])
        if profile:
            env["AGENT_DEVICES"] = json.dumps(
                [
                    {"id": f"t{n:02d}", "address": n, "profile": "sim"}
                    for n in range(1, cell.units + 1)
                ]
            )
        agent = rig.start_agent("a", **env, AGENT_LOCK__TTL_MS="3000")
        agent.wait_for_new(ACTIVE, timeout=20)
        # Every unit is read at the takeover (and its limits, on the line protocol).
        reconciled = agent.wait_for(RECONCILED_IN, timeout=30 + 15 * run.computed_s)
        run.reconciled_s = int(reconciled.group(1)) / 1000
        run.logged_s = int(agent.wait_for(LOGGED_CYCLE, timeout=1).group(1)) / 1000
        pid = agent.proc.pid
        first_plain_cycle(rig, run, agent, 20 + 20 * run.computed_s)
        agent.drain()
        run.rtts = store_round_trips(rig, 50)
        quiet_line(rig, run, agent, max(args.min_s, args.cycles * max(run.computed_s, MODES[mode])))
        agent.drain()
        points = parse_list(args.points, str) if profile else ["setPoint"]
        rng = random.Random(f"{cell}-{mode}")
        cpu0, t0, seq0 = cpu_time(pid), time.monotonic(), rig.last_seq()
        index = 0
        while index < args.changes or time.monotonic() - t0 < args.window_s:
            time.sleep(rng.uniform(0.05, 0.25))  # at any moment of the cycle
            address = rng.randint(1, cell.units)
            point = points[index % len(points)]
            value = pick(point, index // len(points), held(rig, address, point))
            outcome = one_change(rig, address, point, value, args.wait_s)
            if outcome is None:
                run.lost += 1
            else:
                run.changes.append(outcome[0])
                run.write_lines.append(outcome[1])
                run.points.append(point)
            agent.drain()
            index += 1
        window = time.monotonic() - t0
        run.cpu_changes = (cpu_time(pid) - cpu0) / window
        run.changes_per_s = index / window
        busy = rig.background.call(lambda: [r.busy_s for r in rig.device.records_since(seq0)])
        run.line_busy = sum(busy) / window
        run.rss_mb = rss_kb(pid) / 1024
        run.hwm_mb = hwm_kb(pid) / 1024
        run.load = load_average()
        run.rtts += store_round_trips(rig, 50)
        agent.drain()
        run.reopens = [m.group(1) for line in agent.lines if (m := LINE_LOST.search(line))]
    finally:
        rig.close()
    return run


def mode_table(cell: Cell, mode: str, sim: Timed, alone: Timed, points: Sequence[str]) -> Table:
    what = "polls flat out" if mode == "fast" else "polls every 1 s"
    table = Table(
        f"{cell.label}, {what}: profile sim (every unit) beside the set point alone "
        f"(load {sim.load} / {alone.load})"
    )
    for run in (sim, alone):
        cycle = median(run.revisits)
        fake = median(run.fake_cycles)
        if mode == "fast":
            judged = run.profile
            table.add(
                f"poll cycle, {run.what} (median of {len(run.revisits)} revisits)",
                ms(cycle),
                f"{CYCLE_FACTOR}x computed {ms(run.computed_s)} = "
                f"{ms(CYCLE_FACTOR * run.computed_s)}"
                if judged
                else f"computed {ms(run.computed_s)}",
                cycle <= CYCLE_FACTOR * run.computed_s if judged else None,
                f"{cycle / run.computed_s:.3f}x computed (logged {ms(run.logged_s)}); "
                f"{cycle / fake:.3f}x the fake's {ms(fake)}; unanswered {run.unanswered}",
            )
        else:
            table.add(
                f"poll cycle, {run.what} (median of {len(run.revisits)} revisits)",
                ms(cycle),
                f"max(1 s, computed {ms(run.computed_s)})",
                None,
                f"{cycle / max(1.0, run.computed_s):.3f}x; the fake's line time {ms(fake)}",
            )
    for run in (sim, alone):
        kinds = ", ".join(
            f"{count / cell.units:.3g} {kind}" for kind, count in sorted(run.takeover_reads.items())
        )
        table.add(
            f"start: reconciled / the first plain poll cycle, {run.what}",
            f"{run.reconciled_s:.1f} s / {run.takeover_s:.1f} s",
            "",
            None,
            f"requests a unit before that cycle: {kinds or 'none'}",
        )
    for run in (sim, alone):
        floor = run.floor()
        table.add(
            f"change -> read-back, {run.what}: p50 / p99 / max (of {len(run.changes)}, lost "
            f"{run.lost})",
            f"{ms(run.q(0.5))} / {ms(run.q(0.99))} / {ms(run.q(1.0))}",
            "",
            None,
            f"floor {ms(floor)} = RTT {ms(median(run.rtts))} + 2 x poll {ms(run.poll_line)} "
            f"+ write and read-back {ms(median(run.write_lines))}; p99 {run.q(0.99) / floor:.2f}x "
            "the floor",
        )
    if len(points) > 1:
        for point in points:
            latencies = sim.of_point(point)
            if latencies:
                table.add(
                    f"  profile sim, {point} only: p50 / p99 / max (of {len(latencies)})",
                    f"{ms(quantile(latencies, 0.5))} / {ms(quantile(latencies, 0.99))} / "
                    f"{ms(max(latencies))}",
                )
    for run in (sim, alone):
        reasons = Counter(run.reopens)
        table.add(
            f"  line found lost and reopened by the agent, {run.what}",
            f"{len(run.reopens)} times",
            "",
            None,
            "; ".join(f"{count} x {why}" for why, count in reasons.items()),
        )
    table.add("  where the time went, profile sim (medians)", "", "", None, sim.breakdown())
    table.add("  where the time went, set point alone (medians)", "", "", None, alone.breakdown())
    ratio99 = sim.q(0.99) / alone.q(0.99)
    table.add(
        "change -> read-back p99, profile / set point alone",
        f"{ratio99:.2f}x",
        f"<= {LATENCY_FACTOR}x, none lost",
        ratio99 <= LATENCY_FACTOR and sim.lost == 0,
        f"p50 {sim.q(0.5) / alone.q(0.5):.2f}x; floors {sim.floor() / alone.floor():.2f}x; "
        f"lost {sim.lost} / {alone.lost}",
    )
    for run in (sim, alone):
        judged = run.profile and cell.units == RSS_BOUND_UNITS
        table.add(
            f"agent RSS (peak), {run.what}",
            f"{run.rss_mb:.1f} MB ({run.hwm_mb:.1f} MB)",
            f"<= {RSS_BOUND_MB:g} MB" if judged else "",
            run.rss_mb <= RSS_BOUND_MB and run.hwm_mb <= RSS_BOUND_MB if judged else None,
            f"CPU quiet {(run.cpu_quiet or 0) * 100:.2f} %, during changes "
            f"{run.cpu_changes * 100:.2f} % ({run.changes_per_s:.1f} changes/s, line busy "
            f"{run.line_busy * 100:.0f} %)",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--baud", type=int, default=9600)
    parser.add_argument("--units", type=int, default=32)
    parser.add_argument("--modes", default="fast,1s", help="fast (polls flat out), 1s")
    parser.add_argument("--changes", type=int, default=60, help="least remote changes a run")
    parser.add_argument(
        "--points",
        default="setPoint,heatSetPoint,mode",
        help=f"the profile's points changed, in turns (of {', '.join(WRITABLE)})",
    )
    parser.add_argument(
        "--window-s",
        type=float,
        default=65.0,
        help="least time the changes go on (past the agent's reconcile interval, 60 s)",
    )
    parser.add_argument(
        "--wait-s", type=float, default=60.0, help="longest wait for a change's write"
    )
    parser.add_argument("--cycles", type=float, default=3.0, help="cycles in the quiet window")
    parser.add_argument("--min-s", type=float, default=5.0, help="least quiet window")
    parser.add_argument(
        "--turnaround-ms",
        type=float,
        default=5.0,
        help="each unit's turnaround on the fake line (the computed cycle counts 5 ms)",
    )
    args = parser.parse_args()
    points = parse_list(args.points, str)
    unknown = [p for p in points if p not in WRITABLE]
    if unknown:
        parser.error(f"not a point the agent writes: {unknown[0]}")
    began = time.monotonic()
    tables = []
    print(f"load {load_average()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-thermostat-") as tmp:
        for protocol, mode in itertools.product(
            parse_list(args.protocols, str), parse_list(args.modes, str)
        ):
            cell = Cell(protocol, args.baud, args.units, "socket", args.turnaround_ms / 1000)
            directory = Path(tmp) / f"{protocol}-{mode}"
            sim = measure(directory / "sim", cell, mode, True, args)
            alone = measure(directory / "alone", cell, mode, False, args)
            tables.append(mode_table(cell, mode, sim, alone, points))
            tables[-1].print()
    summary(tables)
    print(f"total {time.monotonic() - began:.0f} s, load {load_average()}")


if __name__ == "__main__":
    main()
