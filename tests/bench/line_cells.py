"""What the line benchmarks share: a cell (protocol, baud rate, units, port kind), its rig
(a fake line emulating the line time in this process, the embedded store, the agent as a
real process), the line time of a cell's frames as the fake line spends it, the fake
line's records read as transactions, and the tables.

The fake line's records are the ground truth for what happened on the wire: each names
its client connection, the unit, the kind of request, when the line took it (`at`), how
long it held the line (`busy_s`: the request, the unit's turnaround and the reply at the
emulated baud rate) and how long its request took (`request_s`).
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.controller import line_protocol as lp
from agent.controller.timing import LineTiming
from agent.simulator.line import FakeLine, RequestRecord
from tests.support.processes import AgentProcess
from tests.support.rig import LineRig

PROTOCOLS = ("line", "modbus")
PORT_KINDS = ("socket", "rfc2217", "pty")
POLL_KINDS = frozenset({"GET STATE", "READ HOLDING"})
WRITE_KINDS = frozenset({"SET SP", "WRITE", "WRITE MULTIPLE"})
FAST_POLL_S = 0.001
"""A poll interval shorter than any cycle: polls as fast as the line allows."""


@dataclass(frozen=True, slots=True)
class Cell:
    protocol: str
    """"line" (the ASCII line protocol, 8N1) or "modbus" (RTU, 8E1; 8N2 on a pty)."""
    baud: int
    units: int
    port: str = "socket"
    """socket (raw TCP, a serial device server), rfc2217, or pty (a local device path)."""
    turnaround_s: float = 0.003
    """Each unit's turnaround on the fake line."""

    @property
    def modbus(self) -> bool:
        return self.protocol == "modbus"

    @property
    def framing(self) -> tuple[str, int]:
        """Parity and stop bits: 11 bits a character for Modbus RTU (8E1, or 8N2 on a pty,
        which takes no parity), 10 for the line protocol (8N1)."""
        if not self.modbus:
            return "N", 1
        return ("N", 2) if self.port == "pty" else ("E", 1)

    @property
    def timing(self) -> LineTiming:
        """The line's timing as the fake line keeps it (its bits a character)."""
        return LineTiming(self.baud, 11 if self.modbus else 10, self.turnaround_s)

    @property
    def label(self) -> str:
        return f"{self.protocol:<6} {self.baud:>5} Bd N={self.units:<3} {self.port}"

    # --- the line time of its frames -----------------------------------------------------

    def exchange_s(self, request: int, reply: int) -> float:
        """One exchange's line time: request, turnaround, reply, silent interval."""
        t = self.timing
        return t.chars_s(request) + self.turnaround_s + t.chars_s(reply) + t.silent_s

    @property
    def poll_s(self) -> float:
        """A routine poll of unit 1..N (the frames the agent sends to these addresses)."""
        return self.exchange_s(*self.poll_frame)

    @property
    def poll_frame(self) -> tuple[int, int]:
        if self.modbus:
            return 8, 5 + 2 * 2
        return len(lp.encode_line(f"@{self.units} GET STATE")), len(
            lp.encode_line(f"@{self.units} STATE SP=20.0 T=18.0 OUT=0 MODE=HEAT")
        )

    @property
    def write_s(self) -> float:
        """A set point write: Modbus function 6 and its echo; the line protocol's SET SP and
        its reply, which is the read-back."""
        if self.modbus:
            return self.exchange_s(8, 8)
        return self.exchange_s(
            len(lp.encode_line(f"@{self.units} SET SP 21.5")),
            len(lp.encode_line(f"@{self.units} OK SP 21.5")),
        )

    @property
    def readback_s(self) -> float:
        """The read-back after a write: Modbus reads the register (function 3, one register);
        the line protocol's write reply is its read-back."""
        return self.exchange_s(8, 5 + 2) if self.modbus else 0.0


def transaction_line_s(record: RequestRecord, timing: LineTiming) -> float:
    """What a transaction on the record cost the line: its busy time and the silent
    interval after it."""
    return record.busy_s + timing.silent_s


class CellRig(LineRig):
    """A line rig for one cell: the fake line at the cell's baud rate and protocol, served
    on the cell's kind of port (raw TCP always, for the rig's own needs)."""

    def __init__(self, tmp_path: Path, cell: Cell, **options: Any) -> None:
        self.cell = cell
        tmp_path.mkdir(parents=True, exist_ok=True)
        super().__init__(tmp_path, cell.units, **options)
        if cell.port == "rfc2217":
            self.background.run(self.device.start(rfc2217_port=0))
        elif cell.port == "pty":
            self.background.run(self.device.start(pty_link=tmp_path / "line"))

    def _make_device(self) -> Any:
        return FakeLine(
            units=self.units,
            modbus=self.cell.modbus,
            setpoint=20.0,
            time_constant_s=30.0,
            emulate_baud=self.cell.baud,
            turnaround_s=self.cell.turnaround_s,
        )

    def line_url(self, instance: str) -> str:
        """The URL a master opens: a port of its own on raw TCP (the records name it), the
        RFC 2217 server, or the pty."""
        if self.cell.port == "rfc2217":
            return str(self.device.rfc2217_url)
        if self.cell.port == "pty":
            return str(self.device.pty_link)
        return str(self.background.run(self.device.open_port(instance)))

    def agent_env(self, instance: str, poll_interval_s: float) -> dict[str, Any]:
        parity, stopbits = self.cell.framing
        return {
            "AGENT_SERIAL__URL": self.line_url(instance),
            "AGENT_SERIAL__DRIVER": self.cell.protocol,
            "AGENT_SERIAL__BAUDRATE": str(self.cell.baud),
            "AGENT_SERIAL__PARITY": parity,
            "AGENT_SERIAL__STOPBITS": str(stopbits),
            "AGENT_SERIAL__POLL_INTERVAL_S": str(poll_interval_s),
            "AGENT_SERIAL__MIN_WRITE_INTERVAL_S": "0",
            "AGENT_TELEMETRY__INTERVAL_S": "10",
            "AGENT_LOG_LEVEL": "INFO",
        }

    def start_polling_agent(self, poll_interval_s: float) -> AgentProcess:
        """The active agent, its line reconciled (every unit read once)."""
        agent, _ = self.start_active(
            "a", **self.agent_env("a", poll_interval_s), AGENT_LOCK__TTL_MS="3000"
        )
        return agent

    def records(self) -> list[RequestRecord]:
        return self.background.call(lambda: self.device.records)

    def wait_record(
        self, predicate: Callable[[RequestRecord], bool], since_seq: int, timeout_s: float
    ) -> RequestRecord | None:
        """The first record after `since_seq` that satisfies `predicate`, waited for."""
        found: list[RequestRecord] = []

        def check() -> bool:
            for record in self.device.records_since(since_seq):
                if predicate(record):
                    found.append(record)
                    return True
            return False

        try:
            self.background.run(self.device.wait_for(check, timeout_s), timeout=timeout_s + 5)
        except TimeoutError:
            return None
        return found[0]

    def last_seq(self) -> int:
        seq: int = self.background.call(lambda: self.device.counters.requests)
        return seq


def cpu_time(pid: int) -> float:
    """CPU time of a process's live threads so far (seconds, to the nanosecond: the
    scheduler's own count; /proc/PID/stat counts in 10 ms ticks, too coarse for a quiet
    agent over a few seconds)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU time of each of a process's live threads so far (seconds, by thread id)."""
    times = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            times[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return times


def nodelay(rig: LineRig) -> None:
    sock = rig.client.client.socket()
    assert isinstance(sock, socket.socket)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def store_round_trips(rig: LineRig, count: int) -> list[float]:
    """GETs of the rig's paho client, one after another (the first one not counted)."""
    times = []
    rig.client.request("GET", "t01\\setPoint")
    for _ in range(count):
        started = time.monotonic()
        rig.client.request("GET", "t01\\setPoint")
        times.append(time.monotonic() - started)
    return times


# --- figures and tables -----------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


@dataclass
class Row:
    name: str
    measured: str
    bound: str = ""
    met: bool | None = None
    extra: str = ""


@dataclass
class Table:
    title: str
    rows: list[Row] = field(default_factory=list)

    def add(self, *args: Any, **kwargs: Any) -> None:
        self.rows.append(Row(*args, **kwargs))

    def print(self) -> None:
        print(f"\n{self.title}", flush=True)
        if not self.rows:
            return
        width = max(len(row.name) for row in self.rows)
        measured = max(len(row.measured) for row in self.rows)
        bound = max(len(row.bound) for row in self.rows)
        for row in self.rows:
            verdict = "" if row.met is None else ("met" if row.met else "MISSED")
            print(
                f"  {row.name:<{width}}  {row.measured:>{measured}}  {row.bound:<{bound}}"
                f"  {verdict:<6} {row.extra}".rstrip(),
                flush=True,
            )


def summary(tables: Sequence[Table]) -> None:
    judged = [(t.title, r) for t in tables for r in t.rows if r.met is not None]
    missed = [(title, r) for title, r in judged if not r.met]
    print(f"\nSummary: {len(judged) - len(missed)} of {len(judged)} bounds met", flush=True)
    for title, row in missed:
        print(f"  MISSED  {title}: {row.name}: {row.measured} ({row.bound})", flush=True)


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def parse_list(text: str, kind: Callable[[str], Any] = int) -> list[Any]:
    return [kind(part) for part in text.split(",") if part]
