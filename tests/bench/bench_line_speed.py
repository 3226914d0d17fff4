"""Transactions at line speed, and the poll cycle the agent computes beside the real one.

    python -m tests.bench.bench_line_speed [--part ports,cycles] [--protocols line,modbus]
        [--bauds 9600,19200] [--units 1,8,32,128,247] [--ports socket,rfc2217,pty]

The agent is a real process polling as fast as the line allows (poll interval 1 ms) a fake
line in this process that emulates the line time at the cell's baud rate (each unit's
turnaround 5 ms by default: what the agent's computed cycle counts for a typical unit; Modbus
RTU at 11 bits a character, 8E1, or 8N2 on a pty; the line protocol at 10, 8N1). The fake
line's records are the ground truth: a transaction's cost is the time from its request to
the next one (the line runs flat out, so nothing else is in between), its line time what
the fake held the line for (request, turnaround, reply) plus the silent interval.

Part `ports` (item 1): every kind of port (socket://, rfc2217://, a pty), both protocols,
each baud rate, a line of 8: the median transaction beside its line time. Bound 1.1x.

Part `cycles` (item 3): N = 1 .. 247 on socket://: the poll cycle (any N consecutive
polls, median) beside the line time the agent computes for it at start (and logs, and warns
with: agent.runtime.line.warn_about) and beside the fake line's own. Bound 1.15x the
computed cycle. Also the agent's CPU while it polls flat out and its RSS.
"""

from __future__ import annotations

import argparse
import itertools
import re
import tempfile
import time
from pathlib import Path

from agent.controller.driver import Driver, Unit
from agent.controller.line_driver import LineDriver
from agent.controller.modbus_driver import ModbusDriver
from agent.runtime.line import line_cycle_s
from tests.bench.footprint import rss_kb
from tests.bench.line_cells import (
    FAST_POLL_S,
    PORT_KINDS,
    PROTOCOLS,
    Cell,
    CellRig,
    Table,
    cpu_time,
    load_average,
    median,
    ms,
    parse_list,
    quantile,
    summary,
    transaction_line_s,
)
from tests.support.rig import ACTIVE, RECONCILED

TRANSACTION_FACTOR = 1.1
CYCLE_FACTOR = 1.15
LOGGED_CYCLE = re.compile(r"a poll cycle takes (\d+) ms of line time")


def computed_cycle_s(cell: Cell) -> float:
    """The cycle's line time as the agent computes it at start (runtime.line.warn_about)."""
    parity, stopbits = cell.framing
    options = {"baudrate": cell.baud, "parity": parity, "stopbits": stopbits}
    driver: Driver = (
        ModbusDriver("socket://127.0.0.1:1", **options)  # type: ignore[arg-type]
        if cell.modbus
        else LineDriver("socket://127.0.0.1:1", **options)  # type: ignore[arg-type]
    )
    return line_cycle_s(driver, [Unit(f"t{n:02d}", n) for n in range(1, cell.units + 1)])


class Measured:
    """One cell: the agent polling flat out for a while, from the line's records."""

    def __init__(self, directory: Path, cell: Cell, cycles: float, min_s: float) -> None:
        self.cell = cell
        self.computed = computed_cycle_s(cell)
        rig = CellRig(directory, cell)
        try:
            env = rig.agent_env("a", FAST_POLL_S)
            agent = rig.start_agent("a", **env)
            agent.wait_for_new(ACTIVE, timeout=20)
            # Every unit is read at the takeover (and its limits, on the line protocol).
            agent.wait_for(RECONCILED, timeout=10 + 3 * self.computed)
            logged = agent.wait_for(LOGGED_CYCLE, timeout=1)
            self.logged_s = int(logged.group(1)) / 1000
            time.sleep(0.5)
            since = rig.last_seq()
            cpu0, t0 = cpu_time(agent.proc.pid), time.monotonic()
            time.sleep(max(min_s, cycles * self.computed))
            self.cpu = (cpu_time(agent.proc.pid) - cpu0) / (time.monotonic() - t0)
            self.rss_mb = rss_kb(agent.proc.pid) / 1024
            agent.drain()
            records = [r for r in rig.records() if r.seq > since]
        finally:
            rig.close()
        timing = cell.timing
        self.kinds = sorted({r.kind for r in records})
        self.unanswered = sum(not r.answered for r in records)
        pairs = list(itertools.pairwise(records))
        self.costs = [b.at - a.at for a, b in pairs]
        self.lines = [transaction_line_s(a, timing) for a, _ in pairs]
        self.ratios = [c / line for c, line in zip(self.costs, self.lines, strict=True)]
        n = cell.units
        self.cycles = [records[i + n].at - records[i].at for i in range(len(records) - n)]
        self.fake_cycles = [
            sum(transaction_line_s(r, timing) for r in records[i : i + n])
            for i in range(len(records) - n)
        ]

    @property
    def cost(self) -> float:
        return median(self.costs)

    @property
    def line(self) -> float:
        return median(self.lines)

    @property
    def cycle(self) -> float:
        return median(self.cycles)


def ports_table(directory: Path, args: argparse.Namespace) -> Table:
    table = Table(
        f"Item 1: one transaction beside its line time (request + turnaround + reply + "
        f"silent interval), N={args.port_units}, polling flat out; bound "
        f"{TRANSACTION_FACTOR}x (load {load_average()})"
    )
    for protocol, baud, port in itertools.product(args.protocols, args.bauds, args.ports):
        cell = Cell(protocol, baud, args.port_units, port, args.turnaround_ms / 1000)
        m = Measured(directory / f"ports-{protocol}-{baud}-{port}", cell, 4, args.min_s)
        ratio = m.cost / m.line
        table.add(
            f"{cell.label}: median transaction (of {len(m.costs)})",
            ms(m.cost),
            f"{TRANSACTION_FACTOR}x {ms(m.line)} = {ms(TRANSACTION_FACTOR * m.line)}",
            ratio <= TRANSACTION_FACTOR,
            f"{ratio:.3f}x; p90 {quantile(m.ratios, 0.9):.3f}x, max "
            f"{max(m.ratios):.2f}x; unanswered {m.unanswered}",
        )
    return table


def cycles_table(directory: Path, args: argparse.Namespace) -> Table:
    table = Table(
        f"Item 3: the poll cycle beside the line time the agent computes (bound "
        f"{CYCLE_FACTOR}x) and the fake line's own; socket://, polling flat out, unit "
        f"turnaround {args.turnaround_ms:g} ms (load {load_average()})"
    )
    for protocol, baud, units in itertools.product(args.protocols, args.bauds, args.units):
        cell = Cell(protocol, baud, units, "socket", args.turnaround_ms / 1000)
        m = Measured(directory / f"cycle-{protocol}-{baud}-{units}", cell, args.cycles, args.min_s)
        fake = median(m.fake_cycles)
        table.add(
            f"{cell.label}: poll cycle (median of {len(m.cycles)} windows)",
            ms(m.cycle),
            f"{CYCLE_FACTOR}x computed {ms(m.computed)} = {ms(CYCLE_FACTOR * m.computed)}",
            m.cycle <= CYCLE_FACTOR * m.computed,
            f"{m.cycle / m.computed:.3f}x computed (logged {ms(m.logged_s)}); "
            f"{m.cycle / fake:.3f}x the fake's {ms(fake)}; CPU {m.cpu * 100:.1f} %, "
            f"RSS {m.rss_mb:.1f} MB; unanswered {m.unanswered}",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--part", default="ports,cycles", help="ports, cycles or both")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--bauds", default="9600,19200")
    parser.add_argument("--units", default="1,8,32,128,247", help="N for the cycles")
    parser.add_argument("--ports", default=",".join(PORT_KINDS))
    parser.add_argument("--port-units", type=int, default=8, help="N for the ports part")
    parser.add_argument("--cycles", type=float, default=2.0, help="cycles measured per cell")
    parser.add_argument("--min-s", type=float, default=3.0, help="least measuring time a cell")
    parser.add_argument(
        "--turnaround-ms",
        type=float,
        default=5.0,
        help="each unit's turnaround on the fake line (the computed cycle counts 5 ms)",
    )
    args = parser.parse_args()
    args.protocols = parse_list(args.protocols, str)
    args.bauds = parse_list(args.bauds)
    args.units = parse_list(args.units)
    args.ports = parse_list(args.ports, str)
    parts = parse_list(args.part, str)
    began = time.monotonic()
    tables = []
    with tempfile.TemporaryDirectory(prefix="bench-line-speed-") as tmp:
        if "ports" in parts:
            tables.append(ports_table(Path(tmp), args))
            tables[-1].print()
        if "cycles" in parts:
            tables.append(cycles_table(Path(tmp), args))
            tables[-1].print()
    summary(tables)
    print(f"total {time.monotonic() - began:.0f} s, load {load_average()}")


if __name__ == "__main__":
    main()
