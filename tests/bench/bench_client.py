"""Figures: our StateStoreClient beside raw gmqtt request/response, against the same store.

    python -m tests.bench.bench_client [--seq N] [--total N] [--tasks C] [--rounds R]
                                       [--no-mosquitto]

The bound is the lean raw gmqtt client of bench_store.py sending the same requests (same
QoS, properties and RESP3 payloads) to the same store: the only difference left is our
client layer (StateStoreClient over Session). Each is timed
- sequentially: one request after another (latency p50/p99, and requests/s);
- concurrently: `--tasks` tasks sharing `--total` requests (requests/s and the latency of
  each request, waiting for room in the in-flight window included). Both clients hold
  back requests beyond the broker's window (Receive Maximum - 1: 99 on ours, 19 on
  mosquitto).

Against the embedded emulator (`agent emulator --port 0`, its own process) and, unless
--no-mosquitto, against mosquitto with `agent emulator --external URL`. Rounds interleave
the two clients and the operations (bench_store.interleaved); latencies are pooled over
the rounds, req/s is the median round, client/raw the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import time
from collections.abc import Sequence

from agent.client.session import Session
from agent.client.statestore import StateStoreClient
from agent.config import MqttSettings
from agent.protocol import topics
from tests.bench.bench_store import (
    GET_PAYLOAD,
    KEY,
    SET_PAYLOAD,
    VALUE,
    Figure,
    RawClient,
    Request,
    Verdict,
    check_replies,
    concurrent,
    interleaved,
    p50_ms,
    p99_ms,
    print_verdicts,
    rate_ratio,
)
from tests.support.mosquitto import Mosquitto, mosquitto_binary
from tests.support.processes import READY_URL, AgentProcess

TARGET_RATIO = 0.8
RAW = "raw gmqtt"
OURS = "StateStoreClient"
OPERATIONS = ("GET", "SET")
MODES = ("sequential", "concurrent")


async def our_client(host: str, port: int) -> tuple[Session, StateStoreClient]:
    settings = MqttSettings(host=host, port=port, keepalive_s=60, request_timeout_s=10.0)
    session = Session(settings, client_id=f"bench-client-{os.getpid()}")
    await session.start(wait=True, timeout=10)
    client = StateStoreClient(session, request_timeout_s=10.0)
    await client.start()
    return session, client


async def measure(
    host: str, port: int, *, seq: int, total: int, tasks: int, rounds: int, warmup: int
) -> tuple[dict[str, Figure], int, int]:
    raw = RawClient(host, port, f"bench-raw-{os.getpid()}")
    await raw.connect()
    session, client = await our_client(host, port)
    try:
        await check_replies(raw, echo=False)
        assert (await client.set(KEY, VALUE)).applied, "SET failed"
        assert (await client.get(KEY))[0] == VALUE, "GET failed"

        async def get() -> object:
            return await client.get(KEY)

        async def put() -> object:
            return await client.set(KEY, VALUE)

        requests: dict[str, Request] = {
            f"{RAW} GET": lambda: raw.request(topics.INVOKE_TOPIC, GET_PAYLOAD),
            f"{OURS} GET": get,
            f"{RAW} SET": lambda: raw.request(topics.INVOKE_TOPIC, SET_PAYLOAD),
            f"{OURS} SET": put,
        }
        for request in requests.values():
            await concurrent(request, warmup, tasks)
        figures = await interleaved(requests, seq=seq, pipe=total, tasks=tasks, rounds=rounds)
        return figures, raw.window_size, session.inflight_limit or 0
    finally:
        await client.close()
        await session.stop()
        await raw.close()


def _split(figure: Figure, mode: str) -> tuple[list[float], list[float]]:
    if mode == "sequential":
        return figure.seq_times, figure.seq_rates
    return figure.pipe_times, figure.pipe_rates


def print_table(title: str, figures: dict[str, Figure], tasks: int) -> None:
    print(f"\n{title}")
    header = (
        f"{'op':<4} {'mode':<10} {'n':>6}  {'raw req/s':>9} {'p50 ms':>7} {'p99 ms':>7}  "
        f"{'client req/s':>12} {'p50 ms':>7} {'p99 ms':>7}  {'client/raw':>10}"
    )
    print(header)
    print("-" * len(header))
    for operation in OPERATIONS:
        for mode in MODES:
            raw_times, raw_rates = _split(figures[f"{RAW} {operation}"], mode)
            times, rates = _split(figures[f"{OURS} {operation}"], mode)
            label = mode if mode == "sequential" else f"{tasks} tasks"
            print(
                f"{operation:<4} {label:<10} {len(times):>6}  {statistics.median(raw_rates):>9.0f} "
                f"{p50_ms(raw_times):>7.3f} {p99_ms(raw_times):>7.3f}  "
                f"{statistics.median(rates):>12.0f} {p50_ms(times):>7.3f} {p99_ms(times):>7.3f}  "
                f"{rate_ratio(rates, raw_rates):>10.2f}"
            )


def verdicts(label: str, figures: dict[str, Figure]) -> list[tuple[str, float, bool]]:
    found = []
    for operation in OPERATIONS:
        for mode in MODES:
            _, raw_rates = _split(figures[f"{RAW} {operation}"], mode)
            _, rates = _split(figures[f"{OURS} {operation}"], mode)
            ratio = rate_ratio(rates, raw_rates)
            found.append((f"{label} {operation} {mode}", ratio, ratio >= TARGET_RATIO))
    return found


def run(arguments: argparse.Namespace, host: str, port: int, title: str) -> list[Verdict]:
    figures, raw_window, client_window = asyncio.run(
        measure(
            host,
            port,
            seq=arguments.seq,
            total=arguments.total,
            tasks=arguments.tasks,
            rounds=arguments.rounds,
            warmup=arguments.warmup,
        )
    )
    print_table(
        f"{title} (in-flight window: raw {raw_window}, StateStoreClient {client_window})",
        figures,
        arguments.tasks,
    )
    return [
        Verdict(f"{what} client/raw req/s", f"{ratio:.2f}", f">= {TARGET_RATIO}", ok)
        for what, ratio, ok in verdicts(title.split()[0], figures)
    ]


def main(arguments: argparse.Namespace) -> int:
    logging.getLogger("gmqtt").setLevel(logging.WARNING)
    started = time.perf_counter()
    found: list[Verdict] = []

    server = AgentProcess(["emulator", "--port", "0", "--log-level", "WARNING"])
    try:
        match = server.wait_for(READY_URL, timeout=15)
        found += run(
            arguments,
            match.group(1),
            int(match.group(2)),
            "embedded emulator (`agent emulator --port 0`, its own process)",
        )
    finally:
        server.stop()

    if not arguments.no_mosquitto:
        if mosquitto_binary() is None:
            print("\nmosquitto is not installed: no second table")
        else:
            broker = Mosquitto()
            broker.start()
            service = AgentProcess(["emulator", "--external", broker.url, "--log-level", "WARNING"])
            try:
                service.wait_for(READY_URL, timeout=15)
                found += run(
                    arguments,
                    broker.host,
                    broker.port,
                    "mosquitto + `agent emulator --external`",
                )
            finally:
                service.stop()
                broker.stop()

    print_verdicts(found)
    print(
        f"\nreq/s: median of {arguments.rounds} rounds; latencies pooled over the rounds; "
        f"client/raw: median of the per-round ratios.\n"
        f"Run time {time.perf_counter() - started:.1f} s."
    )
    return 0 if all(v.ok for v in found) else 1


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=200, help="sequential requests per round")
    parser.add_argument("--total", type=int, default=1500, help="concurrent requests per round")
    parser.add_argument("--tasks", type=int, default=100, help="concurrent tasks")
    parser.add_argument("--rounds", type=int, default=10, help="rounds")
    parser.add_argument("--warmup", type=int, default=500, help="requests before timing")
    parser.add_argument("--no-mosquitto", action="store_true", help="embedded emulator only")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main(parse_arguments()))
