"""Faulty units beside healthy ones: a healthy unit's remote change, on a line of 8 where one
unit is silent, one answers garbage and one answers in 400 ms, beside the same line healthy.

    python -m tests.bench.bench_faulty_units [--protocols line,modbus] [--ttls-ms 1000,3000]
        [--changes 40] [--poll-interval-s 1.0]

For each cell (protocol, lease TTL, healthy or faulty) a fresh fake line in this process at
9600 baud, emulating the line time, the embedded store, and the agent as a real process. A
remote change to a healthy unit (a SET of its key at a random moment of the cycle) is
measured as in tests/bench/bench_write_path.py: from just before the SET until the
read-back's reply has left the line. Bound: a faulty line's healthy-unit p50 within one
poll cycle's worth of transactions of the healthy line's, and its max within the longest
transaction a faulty unit can hold the line for (a timeout after the wait for its late
reply) beside the healthy line's max: a write waits for at most the transaction on the line
when it arrives, however the others misbehave.
"""

from __future__ import annotations

import argparse
import itertools
import random
import tempfile
import time
from pathlib import Path

from agent.controller.line_driver import LineDriver
from agent.controller.modbus_driver import ModbusDriver
from tests.bench.bench_write_path import Run, one_change
from tests.bench.line_cells import (
    Cell,
    CellRig,
    Table,
    load_average,
    ms,
    nodelay,
    parse_list,
    summary,
)

UNITS = 8
BAUD = 9600
SILENT_UNIT, GARBAGE_UNIT, SLOW_UNIT = 2, 3, 4
SLOW_MS = 400
FAULTY = (SILENT_UNIT, GARBAGE_UNIT, SLOW_UNIT)


def break_units(rig: CellRig) -> None:
    def faults() -> None:
        rig.unit(SILENT_UNIT).fault("SILENT", 3600)
        rig.unit(GARBAGE_UNIT).fault("GARBAGE", 10**9)
        rig.unit(SLOW_UNIT).fault("SLOW", SLOW_MS)

    rig.background.call(faults)


def measure(
    directory: Path, cell: Cell, ttl_ms: int, faulty: bool, args: argparse.Namespace
) -> Run:
    run = Run("agent")
    rig = CellRig(directory, cell)
    try:
        nodelay(rig)
        if faulty:
            break_units(rig)
        agent, _ = rig.start_active(
            "a", **rig.agent_env("a", args.poll_interval_s), AGENT_LOCK__TTL_MS=str(ttl_ms)
        )
        time.sleep(args.settle_s)  # the faulty units found out
        rng = random.Random(f"{cell}-{ttl_ms}-{faulty}")
        healthy = [a for a in range(1, cell.units + 1) if a not in FAULTY]
        for index in range(args.changes):
            time.sleep(rng.uniform(0.05, 0.5))  # at any moment of the cycle
            address = rng.choice(healthy)
            holds = rig.unit(address).setpoint
            value = 21.5 + 0.5 * (index % 4)
            if value == holds:
                value += 3.0
            outcome = one_change(rig, address, value, fenced=True)
            if outcome is None:
                run.lost += 1
                agent.drain()
                said = [line.rstrip() for line in agent.lines if f"t{address:02d}" in line]
                print(f"  lost: t{address:02d} {value} (change {index}); its log:", *said[-8:])
                continue
            run.changes.append(outcome)
            if index % 10 == 9:
                agent.drain()
        run.load = load_average()
    finally:
        rig.close()
    return run


def longest_faulty_transaction_s(cell: Cell, reply_timeout_s: float) -> float:
    """What a faulty unit's transaction can hold the line for: the wait for its late reply
    (a quiet line for a reply timeout, up to the late reply's window) and its own reply
    timeout, or the slow unit's answer."""
    return max(3 * reply_timeout_s + cell.poll_s, SLOW_MS / 1000 + cell.poll_s)


def reply_timeout_s(cell: Cell) -> float:
    """The agent's reply timeout on the cell's line (its default, from the line's timing)."""
    parity, stopbits = cell.framing
    url = "socket://127.0.0.1:1"
    if cell.modbus:
        return ModbusDriver(
            url, baudrate=cell.baud, parity=parity, stopbits=stopbits
        ).reply_timeout_s
    return LineDriver(url, baudrate=cell.baud).reply_timeout_s


def cell_table(cell: Cell, ttl_ms: int, healthy: Run, faulty: Run) -> Table:
    extra = longest_faulty_transaction_s(cell, reply_timeout_s(cell))
    table = Table(
        f"{cell.label}, TTL {ttl_ms} ms: a healthy unit's remote change -> read-back; faulty: "
        f"unit {SILENT_UNIT} silent, unit {GARBAGE_UNIT} garbage, unit {SLOW_UNIT} "
        f"answers in {SLOW_MS} ms"
    )
    for name, run in (("healthy line", healthy), ("faulty line ", faulty)):
        table.add(
            f"{name} p50 / max (of {len(run.latencies)}, lost {run.lost})",
            f"{ms(run.q(0.5))} / {ms(max(run.latencies, default=float('nan')))}",
            "",
            None,
            run.breakdown(),
        )
    p50_bound = healthy.q(0.5) + cell.units * cell.poll_s
    table.add(
        "faulty p50",
        ms(faulty.q(0.5)),
        f"<= healthy p50 + a cycle's polls = {ms(p50_bound)}",
        faulty.q(0.5) <= p50_bound and faulty.lost == 0,
    )
    max_bound = max(healthy.latencies, default=0.0) + extra
    worst = max(faulty.latencies, default=float("inf"))
    table.add(
        "faulty max",
        ms(worst),
        f"<= healthy max + one faulty transaction = {ms(max_bound)}",
        worst <= max_bound,
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--protocols", default="line,modbus")
    parser.add_argument("--ttls-ms", default="1000,3000")
    parser.add_argument("--changes", type=int, default=40, help="remote changes per run")
    parser.add_argument("--poll-interval-s", type=float, default=1.0)
    parser.add_argument("--settle-s", type=float, default=4.0)
    args = parser.parse_args()
    began = time.monotonic()
    tables = []
    print(f"load {load_average()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-faulty-units-") as tmp:
        for protocol, ttl_ms in itertools.product(
            parse_list(args.protocols, str), parse_list(args.ttls_ms)
        ):
            cell = Cell(protocol, BAUD, UNITS)
            directory = Path(tmp) / f"{protocol}-{ttl_ms}"
            healthy = measure(directory / "healthy", cell, ttl_ms, False, args)
            faulty = measure(directory / "faulty", cell, ttl_ms, True, args)
            tables.append(cell_table(cell, ttl_ms, healthy, faulty))
            tables[-1].print()
    summary(tables)
    print(f"total {time.monotonic() - began:.0f} s, load {load_average()}")


if __name__ == "__main__":
    main()
