"""Figures for the agent as operators run it, each beside its bound or target.

    python -m tests.bench.bench_agent [--changes N] [--rounds R] [--idle-s S] [--ttl-ms T]

Everything runs on this machine over loopback: the rig's embedded state store and fake
controller (a socket:// device line) in this process, the agents as real processes.

1. Remote change -> controller read-back: a remote SET through paho, timed from its
   publication until the active's sync record of that version arrives (the agent writes
   it after the controller's reply to the write, which is its read-back). The fake device
   emulates the line time at 9600 baud (8N1), so the measurement pays the line time the
   bound counts. Bound: 2 x (store round trip + line time of the exchanges: the agent reads
   the controller's state first, then writes; the write's reply is the read-back). The
   round trip is a paho GET measured in the same run (p50 for the p50 bound, p99 for p99).
   The agent runs with min_write_interval_s=0 for this, and the changes are spaced so that
   none waits for the one before.
2. Failover after SIGKILL of the active: from the kill until the standby holds the lock
   (its SET on the lock key, seen through KEYNOTIFY) and until it logs "became active"
   (line read from its output). Target: <= TTL + 300 ms.
3. Handover after SIGTERM: the same, from SIGTERM. Target: <= 300 ms.
4. Resident memory (VmRSS after warm-up; target <= 60 MB) and idle CPU (utime + stime
   over a window; target <= 1% of a core) of an active and a standby with the default
   poll (1 s), telemetry (10 s) and lease (3 s) settings.
"""

from __future__ import annotations

import argparse
import queue
import signal
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.controller import line_protocol as lp
from agent.simulator.device import FakeDevice
from tests.bench.footprint import cpu_seconds, rss_kb
from tests.support.paho_client import Received
from tests.support.processes import AgentProcess
from tests.support.rig import ACTIVE, LOCK_KEY, RECORD_KEY, SETPOINT_KEY, STANDBY, Rig

LINE_BAUD = 9600
BITS_PER_BYTE = 10  # 8N1: start, 8 data, stop
HANDOVER_TARGET_S = 0.3
FAILOVER_SLACK_S = 0.3
RSS_TARGET_KB = 60 * 1024
CPU_TARGET = 0.01
CHANGE_GAP_S = 0.05  # pacing between remote changes, so that none queues
DEFAULTS = {  # the shipped defaults, for the idle figures
    "AGENT_SERIAL__POLL_INTERVAL_S": "1",
    "AGENT_SERIAL__MIN_WRITE_INTERVAL_S": "1",
    "AGENT_TELEMETRY__INTERVAL_S": "10",
    "AGENT_TELEMETRY__JITTER_S": "1",
    "AGENT_LOCK__TTL_MS": "3000",
}


@dataclass
class Row:
    name: str
    measured: str
    bound: str
    met: bool | None  # None: for information


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


class StampedQueue(queue.Queue[tuple[float, Received]]):
    """Stands in for PahoStoreClient.notifications: each notification with its arrival."""

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put((time.monotonic(), item), block, timeout)


# ---------------------------------------------------------------------------- 1. latency


def exchange_bytes(value: float) -> int:
    """Bytes on the line for GET STATE and SET SP, requests and replies, checksummed."""
    lines = (
        lp.format_request(lp.GetState()),
        "STATE SP=21.5 T=20.3 OUT=25 MODE=HEAT",
        lp.format_request(lp.SetSetpoint(value)),
        lp.format_reply(lp.SetpointStored(value)),
    )
    return sum(len(lp.encode_line(line)) for line in lines)


class LineTimeRig(Rig):
    """The rig with a fake device that takes the line time of 9600 baud to answer."""

    def _make_device(self) -> Any:
        return FakeDevice(setpoint=20.0, time_constant_s=30.0, emulate_baud=LINE_BAUD)


def nodelay(rig: Rig) -> None:
    """TCP_NODELAY on the paho client's socket, as our own client has it: with Nagle's
    algorithm and the peer's delayed ACK, a request right after a response waits ~40 ms."""
    sock = rig.client.client.socket()
    assert isinstance(sock, socket.socket)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def store_round_trips(rig: Rig, count: int) -> list[float]:
    times = []
    rig.client.request("GET", SETPOINT_KEY)  # warm up
    for _ in range(count):
        started = time.monotonic()
        rig.client.request("GET", SETPOINT_KEY)
        times.append(time.monotonic() - started)
    return times


def bench_remote_changes(directory: Path, changes: int) -> list[Row]:
    rig = LineTimeRig(directory)
    try:
        nodelay(rig)
        rig.start_active("a", AGENT_SERIAL__MIN_WRITE_INTERVAL_S="0")
        stamped = StampedQueue()
        rig.client.notifications = stamped  # type: ignore[assignment]
        assert rig.client.request("KEYNOTIFY", RECORD_KEY).payload == b"+OK\r\n"
        round_trips = store_round_trips(rig, max(changes, 50))
        latencies: list[float] = []
        for index in range(changes):
            value = 21.5 if index % 2 == 0 else 21.0  # always a change
            token = rig.client.request("GET", LOCK_KEY).prop("__ts")
            while not stamped.empty():
                stamped.get_nowait()
            started = time.monotonic()
            reply = rig.client.request("SET", SETPOINT_KEY, lp.format_number(value), ft=token)
            assert reply.payload == b"+OK\r\n", reply.payload
            version = f'"version":"{reply.prop("__ts")}"'.encode()
            while True:
                stamp, note = stamped.get(timeout=10)
                if version in note.payload:
                    break
            latencies.append(stamp - started)
            time.sleep(CHANGE_GAP_S)
        more_round_trips = store_round_trips(rig, max(changes, 50))
    finally:
        rig.close()
    round_trips += more_round_trips
    line_s = exchange_bytes(21.5) * BITS_PER_BYTE / LINE_BAUD
    rtt50, rtt99 = quantile(round_trips, 0.5), quantile(round_trips, 0.99)
    p50, p99 = quantile(latencies, 0.5), quantile(latencies, 0.99)
    bound50, bound99 = 2 * (rtt50 + line_s), 2 * (rtt99 + line_s)
    return [
        Row("store round trip (paho GET) p50", ms(rtt50), "", None),
        Row("store round trip (paho GET) p99", ms(rtt99), "", None),
        Row(
            f"line time GET STATE + SET SP ({exchange_bytes(21.5)} B at {LINE_BAUD})",
            ms(line_s),
            "",
            None,
        ),
        Row(f"remote change -> read-back p50 (n={changes})", ms(p50), ms(bound50), p50 <= bound50),
        Row(f"remote change -> read-back p99 (n={changes})", ms(p99), ms(bound99), p99 <= bound99),
    ]


# ---------------------------------------------------------------------------- 2./3. takeover


@dataclass
class Takeover:
    lock_s: float
    active_s: float


def takeovers(directory: Path, rounds: int, how: signal.Signals, ttl_ms: int) -> list[Takeover]:
    rig = Rig(directory, ttl_ms=ttl_ms)
    results: list[Takeover] = []
    try:
        nodelay(rig)
        stamped = StampedQueue()
        rig.client.notifications = stamped  # type: ignore[assignment]
        assert rig.client.request("KEYNOTIFY", LOCK_KEY).payload == b"+OK\r\n"
        names = ["a", "b"]
        active, _ = rig.start_active(names[0])
        standby = rig.start_agent(names[1])
        standby.wait_for_new(STANDBY)
        for _ in range(rounds):
            while not stamped.empty():
                stamped.get_nowait()
            new_holder = names[1].encode()
            killed_at = time.monotonic()
            active.signal(how)
            standby.wait_for_new(ACTIVE, timeout=ttl_ms / 1000 + 10)
            active_at = time.monotonic()
            lock_at = None
            while lock_at is None:
                stamp, note = stamped.get(timeout=5)
                holder = note.payload.rsplit(b"\r\n", 2)[-2].split(b"#", 1)[0]
                if b"SET" in note.payload and holder == new_holder:
                    lock_at = stamp
            results.append(Takeover(lock_at - killed_at, active_at - killed_at))
            active.proc.wait(10)
            active.stop()
            # The one that went away comes back as the standby; roles swap.
            names.reverse()
            active = standby
            standby = rig.start_agent(names[1])
            standby.wait_for_new(STANDBY)
    finally:
        rig.close()
    return results


def takeover_rows(label: str, results: list[Takeover], target_s: float, target: str) -> list[Row]:
    rows = []
    for what, values in (
        ("lock taken", [r.lock_s for r in results]),
        ('"became active"', [r.active_s for r in results]),
    ):
        median, worst = statistics.median(values), max(values)
        rows.append(Row(f"{label}: {what}, median (n={len(values)})", ms(median), target, None))
        rows.append(Row(f"{label}: {what}, max", ms(worst), target, worst <= target_s))
    return rows


# ---------------------------------------------------------------------------- 4. footprint


def bench_footprint(directory: Path, idle_s: float) -> list[Row]:
    rig = Rig(directory, ttl_ms=int(DEFAULTS["AGENT_LOCK__TTL_MS"]))
    rows: list[Row] = []
    try:
        active, _ = rig.start_active("a", **DEFAULTS)
        standby = rig.start_agent("b", **DEFAULTS)
        standby.wait_for_new(STANDBY)
        time.sleep(2.0)  # warm-up: first polls, renewals and telemetry behind us
        agents: list[tuple[str, AgentProcess]] = [("active", active), ("standby", standby)]
        before = {role: cpu_seconds(a.proc.pid) for role, a in agents}
        started = time.monotonic()
        time.sleep(idle_s)  # the measurement window
        elapsed = time.monotonic() - started
        for role, agent in agents:
            share = (cpu_seconds(agent.proc.pid) - before[role]) / elapsed
            rss = rss_kb(agent.proc.pid)
            rows.append(
                Row(f"{role}: RSS", f"{rss / 1024:.1f} MB", "<= 60 MB", rss <= RSS_TARGET_KB)
            )
            rows.append(
                Row(
                    f"{role}: idle CPU over {elapsed:.0f} s",
                    f"{share * 100:.2f} %",
                    "<= 1 % of a core",
                    share <= CPU_TARGET,
                )
            )
    finally:
        rig.close()
    return rows


# ---------------------------------------------------------------------------- main


def print_table(title: str, rows: list[Row]) -> None:
    print(f"\n{title}")
    width = max(len(row.name) for row in rows)
    for row in rows:
        verdict = "" if row.met is None else ("met" if row.met else "NOT MET")
        bound = f"bound {row.bound}" if row.bound else ""
        print(f"  {row.name:<{width}}  {row.measured:>10}  {bound:<26} {verdict}")


def timed(step: Callable[[], list[Row]]) -> tuple[list[Row], float]:
    started = time.monotonic()
    rows = step()
    return rows, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--changes", type=int, default=100, help="remote changes (figure 1)")
    parser.add_argument("--rounds", type=int, default=5, help="takeovers of each kind")
    parser.add_argument("--idle-s", type=float, default=20.0, help="idle CPU window")
    parser.add_argument("--ttl-ms", type=int, default=1500, help="lease TTL for 2. and 3.")
    args = parser.parse_args()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        directory = Path(tmp)
        rows, took = timed(lambda: bench_remote_changes(directory / "latency", args.changes))
        print_table(f"1. remote change -> controller read-back ({took:.0f} s)", rows)
        print(
            "     the fake device emulates the line time at 9600 baud 8N1;"
            "\n     min_write_interval_s=0 for this figure"
        )

        failover_target = args.ttl_ms / 1000 + FAILOVER_SLACK_S
        results = takeovers(directory / "failover", args.rounds, signal.SIGKILL, args.ttl_ms)
        print_table(
            f"2. failover after SIGKILL of the active (TTL {args.ttl_ms} ms)",
            takeover_rows(
                "SIGKILL", results, failover_target, f"<= TTL+300 = {ms(failover_target)}"
            ),
        )

        results = takeovers(directory / "handover", args.rounds, signal.SIGTERM, args.ttl_ms)
        print_table(
            "3. handover after SIGTERM of the active",
            takeover_rows("SIGTERM", results, HANDOVER_TARGET_S, f"<= {ms(HANDOVER_TARGET_S)}"),
        )
        print(
            "     the active waits for a write in progress, releases the lock, then closes"
            "\n     the controller port"
        )

        rows, took = timed(lambda: bench_footprint(directory / "footprint", args.idle_s))
        print_table(
            f"4. footprint with the default poll 1 s, telemetry 10 s, TTL 3 s ({took:.0f} s)",
            rows,
        )
    print(f"\ntotal {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
