"""Figures: the fake line's own cost per transaction, and its emulated line time beside
the theoretical line time, for N = 1, 8, 32, 128 units at 9600 and 19200 baud.

    python -m tests.bench.bench_fake_line [--count N] [--cost-count N]

The fake runs as `agent sim-device --units N --tcp 0 [--modbus] [--emulate-baud B]`, a
process of its own; this process polls it back to back over TCP with a lean blocking
client (GET STATE in the line protocol; a read of the set point and temperature
registers in Modbus RTU), round the units.

- "fake CPU/tx": the CPU time the fake's process spent per transaction (from
  /proc/<pid>/task/*/schedstat, in ns), without and with line-time emulation. Beside it,
  that time as a share of the transaction's line time: a line polled back to back must be
  dominated by its line time, not by the fake.
- "wall/tx" without emulation: the round trip of client, TCP and fake together.
- With emulation, "wall/tx" beside "line/tx", the theoretical line time of the same bytes
  (request and reply, 10 bits a byte for the line protocol, 11 for Modbus RTU): the ratio
  shows what the fake and the machine add on top of the line.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.controller import line_protocol as lp
from agent.simulator.rtu import with_crc

UNIT_COUNTS = (1, 8, 32, 128)
BAUD_RATES = (9600, 19200)
PROTOCOLS = ("line", "modbus")
RTU_REPLY = 9
"""Bytes of the reply to a read of two registers: address, function, count, data, CRC."""


@dataclass
class Figure:
    protocol: str
    units: int
    baud: int | None
    count: int
    wall_s: list[float]
    line_s: list[float]
    cpu_s: float

    @property
    def wall_per_tx(self) -> float:
        return statistics.fmean(self.wall_s)

    @property
    def line_per_tx(self) -> float | None:
        return statistics.fmean(self.line_s) if self.baud else None

    @property
    def cpu_per_tx(self) -> float:
        return self.cpu_s / self.count


def cpu_time_s(pid: int) -> float:
    """CPU time of every thread of a process, in seconds (nanosecond resolution)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


@contextlib.contextmanager
def sim_device(units: int, protocol: str, baud: int | None) -> Iterator[tuple[int, int]]:
    """The fake line as a process: (its pid, its TCP port)."""
    args = [sys.executable, "-m", "agent", "sim-device", "--units", str(units), "--tcp", "0"]
    if protocol == "modbus":
        args.append("--modbus")
    if baud is not None:
        args += ["--emulate-baud", str(baud)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        ready = process.stdout.readline().split()
        port = int(ready[ready.index("device") + 1].rsplit(":", 1)[1])
        yield process.pid, port
    finally:
        process.terminate()
        process.wait(10)


class LineClient:
    """A blocking client for one protocol, as lean as can be."""

    def __init__(self, port: int, protocol: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.protocol = protocol
        self.requests = {
            unit: (
                lp.encode_line(f"@{unit} GET STATE")
                if protocol == "line"
                else with_crc(bytes((unit, 3, 0, 0, 0, 2)))
            )
            for unit in range(1, 248)
        }

    def transact(self, unit: int) -> tuple[int, int]:
        """One request and its reply: (request bytes, reply bytes)."""
        request = self.requests[unit]
        self.sock.sendall(request)
        reply = b""
        while not (reply.endswith(b"\n") if self.protocol == "line" else len(reply) >= RTU_REPLY):
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the fake closed the connection")
            reply += chunk
        return len(request), len(reply)

    def close(self) -> None:
        self.sock.close()


def run(protocol: str, units: int, baud: int | None, count: int) -> Figure:
    bits = 10 if protocol == "line" else 11
    with sim_device(units, protocol, baud) as (pid, port):
        client = LineClient(port, protocol)
        try:
            for unit in range(1, units + 1):  # warm up: every unit once
                client.transact(unit)
            wall: list[float] = []
            line: list[float] = []
            cpu_before = cpu_time_s(pid)
            for unit in itertools.islice(itertools.cycle(range(1, units + 1)), count):
                started = time.perf_counter()
                sent, received = client.transact(unit)
                wall.append(time.perf_counter() - started)
                if baud:
                    line.append((sent + received) * bits / baud)
            cpu = cpu_time_s(pid) - cpu_before
        finally:
            client.close()
    return Figure(protocol, units, baud, count, wall, line, cpu)


def main(count: int, cost_count: int, unit_counts: tuple[int, ...]) -> list[Figure]:
    figures: list[Figure] = []
    for protocol in PROTOCOLS:
        for units in unit_counts:
            figures.append(run(protocol, units, None, cost_count))
            for baud in BAUD_RATES:
                figures.append(run(protocol, units, baud, max(count, units)))
    return figures


def print_table(figures: list[Figure]) -> None:
    header = (
        f"{'protocol':<8} {'N':>4} {'baud':>6} {'tx':>5}  {'fake CPU/tx us':>14}  "
        f"{'of line time':>12}  {'wall/tx ms':>10}  {'line/tx ms':>10}  {'wall/line':>9}  "
        f"{'p95 wall/line':>13}"
    )
    print(header)
    print("-" * len(header))
    for f in figures:
        line = f.line_per_tx
        if line is None:
            share = ratio = p95 = "-"
            line_text = "-"
        else:
            share = f"{f.cpu_per_tx / line:.2%}"
            ratio = f"{f.wall_per_tx / line:.3f}"
            worst = statistics.quantiles(
                [w / s for w, s in zip(f.wall_s, f.line_s, strict=True)], n=20
            )[-1]
            p95 = f"{worst:.3f}"
            line_text = f"{line * 1e3:.2f}"
        print(
            f"{f.protocol:<8} {f.units:>4} {f.baud or '-':>6} {f.count:>5}  "
            f"{f.cpu_per_tx * 1e6:>14.0f}  {share:>12}  {f.wall_per_tx * 1e3:>10.3f}  "
            f"{line_text:>10}  {ratio:>9}  {p95:>13}"
        )
    print(
        "\nfake CPU/tx: the fake process's CPU time per transaction; baud '-': no emulation"
        " (its own cost alone).\nline/tx: theoretical line time of the request and reply"
        " bytes (10 bits a byte, line protocol; 11, Modbus RTU); wall/line = measured /"
        " theoretical."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--count", type=int, default=64, help="transactions per emulated figure (at least N)"
    )
    parser.add_argument(
        "--cost-count", type=int, default=3000, help="transactions per figure without emulation"
    )
    parser.add_argument(
        "--units", type=int, nargs="+", default=UNIT_COUNTS, help="line sizes to measure"
    )
    arguments = parser.parse_args()
    print_table(main(arguments.count, arguments.cost_count, tuple(arguments.units)))
