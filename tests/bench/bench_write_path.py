"""The write path at its floor, beside a peer: a remote change to the read-back on the unit.

    python -m tests.bench.bench_write_path [--protocols line,modbus] [--bauds 9600,19200]
        [--units 8,32] [--modes fast,1s,dead] [--changes 40] [--no-peer]

For each cell (protocol, baud rate, N, mode) a fresh fake line in this process, emulating the
line time (each unit's turnaround 3 ms), the embedded store, and one master as a real
process: the agent, then (Modbus only) the peer of tests/bench/peer_poller.py (pymodbus
async client behind one lock, an entity per unit on its own scan interval, a write = write
register + read back), never both on the line at once. Modes: `fast` polls as fast as the
line allows (the agent at a 1 ms interval; the peer's scan interval the cycle's line time),
`1s` polls every second, `dead` and `dead-1s` the same with unit 2 silent from the start.

A remote change is a SET of `t<NN>\\setPoint` by a store client of this process (fenced
with the line's lock for the agent) at a random moment; it is measured from just before the
SET is published until the read-back's reply has left the line, by the fake line's records:
the write to that unit with that value, then (Modbus) the next read of the unit; the line
protocol's write reply is its read-back. Floor of that sequence: one store round trip (GET,
p50, measured in the same run), the transaction already on the line (a poll), the read
before the write that protects a panel change, the write, and (Modbus) the read-back, at
the line's timing. Bound: p99 <= 1.3x the floor. The agent's own sequence also writes the
pending sync record (one more round trip) before the write.

Also per cell: whether the agent read the unit between the change and the write (the read
it skips when a fresh reading serves), CPU (quiet: no changes, N = 32 only; during the
changes) and RSS of each master. Targets: the agent ahead of the peer on every busy (fast)
or faulty (dead) cell; within one transaction of it on a quiet (1s) line; CPU <= 2 % of a
core at N = 32, 9600 baud. At N = 32, each master's CPU a transaction (the quiet window's CPU
over the transactions the line carried in it) and a remote change above polling (the changes'
window's CPU less its transactions at that cost, over the changes); bounds for the agent at
9600 baud polling flat out: 0.3 ms and 1 ms; its RSS there at most 32 MB, beside the
peer's. Beside them, a change's CPU by thread (the event loop, the bus, the workers that save
the state files), each above its own quiet rate a second: where a change's cost is.
"""

from __future__ import annotations

import argparse
import itertools
import random
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.controller import line_protocol as lp
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
    thread_cpu,
)

FLOOR_FACTOR = 1.3
CPU_TARGET = 0.02
TRANSACTION_CPU_S = 0.0003
"""The agent's CPU a transaction: 1 % of a core for a line of 32 at 9600 baud."""
CHANGE_CPU_S = 0.001
"""The agent's CPU a remote change, above the polling's."""
RSS_MB = 32.0
"""The agent's resident memory for a line of 32."""
DEAD_UNIT = 2
READ_KINDS = frozenset({"GET STATE", "READ HOLDING", "GET SP"})


@dataclass
class Run:
    """One master on one cell."""

    master: str
    changes: list[Change] = field(default_factory=list)
    rtts: list[float] = field(default_factory=list)
    cpu_quiet: float | None = None
    cpu_changes: float = 0.0
    changes_per_s: float = 0.0
    line_busy: float = 0.0
    load: str = ""
    """The machine's load average when the changes were over."""
    """The share of the time the line was held while the changes were made."""
    rss_mb: float = 0.0
    bus_thread: int = 0
    """The bus's thread id (the busiest but the event loop's on the quiet line)."""
    quiet_threads: dict[str, float] = field(default_factory=dict)
    change_threads: dict[str, float] = field(default_factory=dict)
    """CPU seconds by thread (event loop, bus, workers) in the quiet window and the changes'."""
    quiet_transactions: int = 0
    change_transactions: int = 0
    """Transactions on the line in the quiet window and while the changes were made."""
    quiet_window_s: float = 0.0
    window_s: float = 0.0
    """How long the quiet window and the changes took."""
    lost: int = 0
    """Changes whose read-back never came (within the wait)."""

    @property
    def cpu_per_transaction(self) -> float:
        """CPU seconds a transaction on the quiet line (polls alone)."""
        if self.cpu_quiet is None or not self.quiet_transactions:
            return float("nan")
        return self.cpu_quiet * self.quiet_window_s / self.quiet_transactions

    @property
    def cpu_per_change(self) -> float:
        """CPU seconds a remote change above polling: the window's CPU less its
        transactions at the quiet line's cost each."""
        made = len(self.changes) + self.lost
        if not made:
            return float("nan")
        polling = self.change_transactions * self.cpu_per_transaction
        return (self.cpu_changes * self.window_s - polling) / made

    @property
    def latencies(self) -> list[float]:
        return [c.latency for c in self.changes]

    def q(self, q: float) -> float:
        return quantile(self.latencies, q) if self.changes else float("nan")

    def breakdown(self) -> str:
        """Medians of where the time went, and how often the unit was read before its write."""
        reads = [c.reads for c in self.changes]
        first = [c.to_first_read for c in self.changes if c.to_first_read is not None]
        gap = [c.read_to_write for c in self.changes if c.read_to_write is not None]
        back = [c.write_to_readback for c in self.changes]
        parts = [
            f"reads before the write 0/1/2+: {reads.count(0)}/{reads.count(1)}/"
            f"{sum(1 for n in reads if n > 1)}"
        ]
        if first:
            parts.append(f"change->read {ms(median(first))}")
        if gap:
            parts.append(f"read->write {ms(median(gap))}")
        parts.append(f"write->read-back {ms(median(back))}")
        return "; ".join(parts)


class Peer:
    """The peer process, its stdout read for its ready line."""

    def __init__(self, rig: CellRig, scan_s: float, log: Path, args: argparse.Namespace) -> None:
        cell = rig.cell
        parity, stopbits = cell.framing
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.bench.peer_poller",
                "--url",
                rig.line_url("peer"),
                "--store-port",
                str(rig.port),
                "--units",
                str(cell.units),
                "--baud",
                str(cell.baud),
                "--parity",
                parity,
                "--stopbits",
                str(stopbits),
                "--scan-interval-s",
                f"{scan_s:.4f}",
                "--timeout-s",
                str(args.peer_timeout_s),
                "--retries",
                str(args.peer_retries),
            ],
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if select.select([self.proc.stdout], [], [], 1)[0]:
                line = self.proc.stdout.readline()
                if not line:
                    break
                if line.startswith(b"peer ready"):
                    return
        raise RuntimeError(f"the peer did not start; see {log}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@dataclass(frozen=True, slots=True)
class Change:
    latency: float
    reads: int
    """Reads of the unit between the change and its write: 1, the read that protects a panel
    change; 0, a poll's reading taken since served; 2, the bus read again before the write."""
    to_first_read: float | None
    """From the change to the first read's start (the store, the transaction on the line)."""
    read_to_write: float | None
    """From the end of the last read before the write to the write's start."""
    write_to_readback: float
    """From the end of the write to the read-back's start (Modbus; 0 otherwise)."""


def one_change(rig: CellRig, address: int, value: float, fenced: bool) -> Change | None:
    """One remote change, from the line's records."""
    cell = rig.cell
    since = rig.last_seq()
    key = f"t{address:02d}\\setPoint"
    token = rig.client.request("GET", f"{rig.LINE}\\lock").prop("__ts") if fenced else None
    text = lp.format_number(value)
    started = time.monotonic()
    if token is None:
        reply = rig.client.request("SET", key, text)
    else:
        reply = rig.client.request("SET", key, text, ft=token)
    assert reply.payload == b"+OK\r\n", reply.payload
    write = rig.wait_record(
        lambda r: r.address == address and r.kind in WRITE_KINDS and r.value == value,
        since,
        10.0,
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
        if r.seq < write.seq and r.address == address and r.kind in READ_KINDS and r.at >= started
    ]
    return Change(
        end.ended_at - started,
        len(reads),
        reads[0].at - started if reads else None,
        write.at - reads[-1].ended_at if reads else None,
        end.at - write.ended_at if end is not write else 0.0,
    )


def measure(directory: Path, cell: Cell, mode: str, master: str, args: argparse.Namespace) -> Run:
    run = Run(master)
    rig = CellRig(directory, cell)
    poll_s = FAST_POLL_S if mode in ("fast", "dead") else 1.0
    dead = mode.startswith("dead")
    process_pid: int
    peer: Peer | None = None
    agent = None
    try:
        nodelay(rig)
        if dead:
            rig.background.call(lambda: rig.unit(DEAD_UNIT).fault("SILENT", 3600))
        if master == "agent":
            agent = rig.start_polling_agent(poll_s)
            process_pid = agent.proc.pid
        else:
            scan_s = cell.units * cell.poll_s if poll_s == FAST_POLL_S else poll_s
            peer = Peer(rig, scan_s, directory / "peer.log", args)
            process_pid = peer.proc.pid
        time.sleep(2.0)  # a dead unit found out, the first cycles behind
        run.rtts = store_round_trips(rig, 50)
        if cell.units == 32 and args.quiet_s > 0:
            cpu0, t0, quiet0 = cpu_time(process_pid), time.monotonic(), rig.last_seq()
            threads0 = thread_cpu(process_pid)
            time.sleep(args.quiet_s)
            run.quiet_window_s = time.monotonic() - t0
            run.cpu_quiet = (cpu_time(process_pid) - cpu0) / run.quiet_window_s
            run.quiet_transactions = rig.last_seq() - quiet0
            used = spent(threads0, thread_cpu(process_pid))
            # Polled flat out, the busiest thread but the event loop's is the bus's.
            run.bus_thread = max(
                (tid for tid in used if tid != process_pid), key=used.__getitem__, default=0
            )
            run.quiet_threads = by_role(used, process_pid, run.bus_thread)
        rng = random.Random(f"{cell}-{mode}")
        addresses = [a for a in range(1, cell.units + 1) if not (dead and a == DEAD_UNIT)]
        cpu0, t0, seq0 = cpu_time(process_pid), time.monotonic(), rig.last_seq()
        threads0 = thread_cpu(process_pid)
        for index in range(args.changes):
            time.sleep(rng.uniform(0.05, 0.25))  # at any moment of the cycle
            address = rng.choice(addresses)
            holds = rig.unit(address).setpoint  # read across threads: one attribute
            value = 21.5 + 0.5 * (index % 4)
            if value == holds:
                value += 3.0
            outcome = one_change(rig, address, value, fenced=master == "agent")
            if outcome is None:
                run.lost += 1
                continue
            run.changes.append(outcome)
            if agent is not None and index % 10 == 9:
                agent.drain()
        window = run.window_s = time.monotonic() - t0
        run.cpu_changes = (cpu_time(process_pid) - cpu0) / window
        if run.quiet_threads:
            used = spent(threads0, thread_cpu(process_pid))
            run.change_threads = by_role(used, process_pid, run.bus_thread)
        run.change_transactions = rig.last_seq() - seq0
        run.changes_per_s = args.changes / window
        busy = rig.background.call(lambda: [r.busy_s for r in rig.device.records_since(seq0)])
        run.line_busy = sum(busy) / window
        run.rss_mb = rss_kb(process_pid) / 1024
        run.load = load_average()
        run.rtts += store_round_trips(rig, 50)
    finally:
        if peer is not None:
            peer.stop()
        rig.close()
    return run


def spent(before: dict[int, float], after: dict[int, float]) -> dict[int, float]:
    """Each thread's CPU seconds between two readings of thread_cpu."""
    return {tid: after[tid] - before.get(tid, 0.0) for tid in after}


def by_role(used: dict[int, float], loop_thread: int, bus_thread: int) -> dict[str, float]:
    """A window's CPU seconds by thread: the event loop's (the main thread), the bus's and
    the rest (the workers that save the state files)."""
    return {
        "event loop": used.get(loop_thread, 0.0),
        "bus": used.get(bus_thread, 0.0),
        "workers": sum(t for tid, t in used.items() if tid not in (loop_thread, bus_thread)),
    }


def cpu_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def floor_s(cell: Cell, rtt: float) -> float:
    """Store round trip, the poll already on the line, the read before the write, the
    write, the read-back."""
    return rtt + 2 * cell.poll_s + cell.write_s + cell.readback_s


def cell_table(cell: Cell, mode: str, agent: Run, peer: Run | None) -> Table:
    rtt = median(agent.rtts)
    floor = floor_s(cell, rtt)
    bound = FLOOR_FACTOR * floor
    what = {
        "fast": "polls flat out",
        "1s": "polls every 1 s",
        "dead": "polls flat out, unit 2 dead",
        "dead-1s": "polls every 1 s, unit 2 dead",
    }[mode]
    table = Table(
        f"{cell.label}, {what}: remote change -> read-back on the unit; floor "
        f"{ms(floor)} = RTT {ms(rtt)} + poll on the line {ms(cell.poll_s)} + read "
        f"{ms(cell.poll_s)} + write {ms(cell.write_s)} + read-back {ms(cell.readback_s)}"
    )
    table.add(
        f"agent p50 / p99 (of {len(agent.latencies)}, lost {agent.lost})",
        f"{ms(agent.q(0.5))} / {ms(agent.q(0.99))}",
        f"p99 <= {FLOOR_FACTOR}x floor = {ms(bound)}",
        agent.q(0.99) <= bound,
        f"p50 {agent.q(0.5) / floor:.2f}x, p99 {agent.q(0.99) / floor:.2f}x the floor",
    )
    table.add("agent: where the time went (medians)", "", "", None, agent.breakdown())
    if peer is not None:
        peer_floor = floor - cell.poll_s  # it reads nothing before its write
        table.add(
            f"peer  p50 / p99 (of {len(peer.latencies)}, lost {peer.lost})",
            f"{ms(peer.q(0.5))} / {ms(peer.q(0.99))}",
            "",
            None,
            f"p50 {peer.q(0.5) / floor:.2f}x, p99 {peer.q(0.99) / floor:.2f}x the floor "
            f"(its own, without the read: {ms(peer_floor)})",
        )
        table.add("peer: where the time went (medians)", "", "", None, peer.breakdown())
        ratio50, ratio99 = agent.q(0.5) / peer.q(0.5), agent.q(0.99) / peer.q(0.99)
        if mode in ("1s", "dead-1s"):
            gap = agent.q(0.5) - peer.q(0.5)
            table.add(
                "agent - peer, p50 (quiet line)",
                ms(gap),
                f"<= one transaction = {ms(cell.poll_s)}",
                gap <= cell.poll_s,
                f"agent / peer p50 {ratio50:.2f}x, p99 {ratio99:.2f}x",
            )
            if mode == "dead-1s":
                table.add(
                    "agent / peer, p99 (a dead unit)",
                    f"{ratio99:.2f}x",
                    "< 1 (ahead of the peer)",
                    ratio99 < 1,
                )
        else:
            table.add(
                "agent / peer, p50 / p99",
                f"{ratio50:.2f}x / {ratio99:.2f}x",
                "< 1 (ahead of the peer)",
                ratio50 < 1 and ratio99 < 1,
            )
    for run in (agent, peer):
        if run is None:
            continue
        cpu_bound = cell.units == 32 and cell.baud == 9600 and run.master == "agent"
        quiet = "" if run.cpu_quiet is None else f"quiet {run.cpu_quiet * 100:.2f} % / "
        per_change = (run.cpu_changes - (run.cpu_quiet or 0)) / run.changes_per_s
        if run.cpu_quiet is not None:
            cost_bound = cpu_bound and mode == "fast"
            table.add(
                f"{run.master} CPU a transaction (of {run.quiet_transactions}, quiet) / a "
                f"remote change above polling",
                f"{cpu_ms(run.cpu_per_transaction)} / {cpu_ms(run.cpu_per_change)}",
                f"<= {cpu_ms(TRANSACTION_CPU_S)} / {cpu_ms(CHANGE_CPU_S)}" if cost_bound else "",
                run.cpu_per_transaction <= TRANSACTION_CPU_S and run.cpu_per_change <= CHANGE_CPU_S
                if cost_bound
                else None,
                f"{run.change_transactions} transactions during the {len(run.changes)} "
                f"changes ({run.window_s:.1f} s)",
            )
        table.add(
            f"{run.master} CPU {'quiet / ' if quiet else ''}during changes, RSS",
            f"{quiet}{run.cpu_changes * 100:.2f} %, {run.rss_mb:.1f} MB",
            "CPU quiet <= 2 % of a core" if cpu_bound else "",
            (run.cpu_quiet or 0) <= CPU_TARGET if cpu_bound else None,
            f"load {run.load}; {run.changes_per_s:.1f} changes/s"
            + (f", {per_change * 1e3:.1f} ms CPU a change" if run.cpu_quiet is not None else "")
            + f"; line busy {run.line_busy * 100:.0f} %",
        )
        if run.change_threads and run.quiet_threads:
            made = max(1, len(run.changes) + run.lost)
            above = {
                role: (
                    run.change_threads[role]
                    - run.quiet_threads[role] / run.quiet_window_s * run.window_s
                )
                / made
                for role in ("event loop", "bus", "workers")
            }
            table.add(
                f"{run.master} CPU a change above the quiet line's, by thread",
                " / ".join(f"{cpu_ms(t)}" for t in above.values()),
                "",
                None,
                "event loop / bus / workers (a second's quiet CPU taken off, not a transaction's)",
            )
        if cpu_bound:
            table.add(
                "agent RSS",
                f"{run.rss_mb:.1f} MB",
                f"<= {RSS_MB:.0f} MB",
                run.rss_mb <= RSS_MB,
                "" if peer is None else f"the peer {peer.rss_mb:.1f} MB",
            )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--bauds", default="9600,19200")
    parser.add_argument("--units", default="8,32")
    parser.add_argument(
        "--modes", default="fast,1s,dead,dead-1s", help="fast, 1s, dead (flat out), dead-1s"
    )
    parser.add_argument("--changes", type=int, default=40, help="remote changes per run")
    parser.add_argument("--quiet-s", type=float, default=10.0, help="quiet CPU window at N=32")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--peer-timeout-s", type=float, default=0.3)
    parser.add_argument("--peer-retries", type=int, default=3)
    args = parser.parse_args()
    began = time.monotonic()
    tables = []
    print(f"load {load_average()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-write-path-") as tmp:
        for protocol, baud, units, mode in itertools.product(
            parse_list(args.protocols, str),
            parse_list(args.bauds),
            parse_list(args.units),
            parse_list(args.modes, str),
        ):
            cell = Cell(protocol, baud, units)
            directory = Path(tmp) / f"{protocol}-{baud}-{units}-{mode}"
            agent = measure(directory / "agent", cell, mode, "agent", args)
            peer = None
            if cell.modbus and not args.no_peer:
                peer = measure(directory / "peer", cell, mode, "peer", args)
            tables.append(cell_table(cell, mode, agent, peer))
            tables[-1].print()
    summary(tables)
    print(f"total {time.monotonic() - began:.0f} s, load {load_average()}")


if __name__ == "__main__":
    main()
