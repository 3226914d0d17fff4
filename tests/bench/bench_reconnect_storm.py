"""A reconnect storm: 50 sessions cut at once do not come back in lock-step.

    python -m tests.bench.bench_reconnect_storm [--clients 50] [--rounds 3]

The project's own MQTT sessions (agent.client.session, the configured backoff: exponential
with full jitter, agent/backoff.py) connect to the embedded broker through one fault proxy,
in this process. A round: the proxy resets every connection at once (``cut()``); each
session's first reconnect after it (CONNACK, subscriptions made: its on-connect hook) is
timed from the cut, and so is its new TCP connection's arrival at the proxy (what the
broker sees). Each round uses fresh sessions, so that each cut meets the first backoff
step. The figure is their spread (min, p50, p90, max) and the most that came back within any
10 ms window.

The anchor, measured the same way in the same run: the same sessions with a lock-step
schedule (every session waits exactly the first backoff ceiling, as a fixed reconnect delay
does, gmqtt's own being 6 s), which shows how close together "all at once" lands here.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import time
from typing import Any

from agent.backoff import backoff_ceiling
from agent.client.session import Session
from agent.config import MqttSettings
from agent.emulator.embedded import EmbeddedStateStore
from tests.harness.proxy import FaultProxy

WINDOW_S = 0.010


class LockStep(random.Random):
    """Draws the top of every interval: each session waits the full ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def most_within(times: list[float], window: float) -> int:
    ordered = sorted(times)
    best, start = 0, 0
    for end, at in enumerate(ordered):
        while at - ordered[start] > window:
            start += 1
        best = max(best, end - start + 1)
    return best


async def storm(
    settings: MqttSettings, clients: int, lock_step: bool
) -> tuple[list[float], list[float]]:
    """Fresh sessions, one cut: when each came back (seconds after the cut), as the proxy
    saw its first new connection arrive and as the session saw itself connected again."""
    proxy = await FaultProxy((settings.host, settings.port)).start()
    via_proxy = settings.model_copy(update={"port": proxy.port})
    back: dict[int, float] = {}
    everyone_back = asyncio.Event()
    sessions: list[Session] = []

    def hook_for(index: int) -> Any:
        async def connected() -> None:
            if index not in back:
                back[index] = time.monotonic()
                if len(back) == clients:
                    everyone_back.set()

        return connected

    for index in range(clients):
        rng = LockStep() if lock_step else random.Random()
        session = Session(via_proxy, client_id=f"storm-{index:02d}", rng=rng)
        await session.subscribe(f"storm/{index}", lambda message: None)
        sessions.append(session)
    try:
        await asyncio.gather(*(s.start(timeout=30) for s in sessions))
        for index, session in enumerate(sessions):
            session.on_connect(hook_for(index))
        accepted = len(proxy.stats.connected_at)
        cut_at = time.monotonic()
        proxy.cut()
        await asyncio.wait_for(everyone_back.wait(), 60)
        arrived = [at - cut_at for at in proxy.stats.connected_at[accepted:][:clients]]
        return arrived, [at - cut_at for at in back.values()]
    finally:
        await asyncio.gather(*(s.stop() for s in sessions), return_exceptions=True)
        await proxy.stop()


def show(label: str, delays: list[float], clients: int, rounds: int) -> None:
    per_round = len(delays) // rounds  # the window is counted within each round
    windows = max(
        most_within(delays[r * per_round : (r + 1) * per_round], WINDOW_S) for r in range(rounds)
    )
    print(
        f"  {label:<40} min {min(delays) * 1000:5.0f}  p50 {quantile(delays, 0.5) * 1000:5.0f}"
        f"  p90 {quantile(delays, 0.9) * 1000:5.0f}  max {max(delays) * 1000:5.0f} ms"
        f"  (stdev {statistics.pstdev(delays) * 1000:4.0f} ms);"
        f"  most within {WINDOW_S * 1000:.0f} ms: {windows}/{clients}",
        flush=True,
    )


async def main_async(clients: int, rounds: int) -> None:
    store = EmbeddedStateStore("127.0.0.1", 0)
    await store.start()
    try:
        settings = MqttSettings(host="127.0.0.1", port=store.port)
        ceiling = backoff_ceiling(0, settings.reconnect_min_s, settings.reconnect_max_s)
        print(
            f"{clients} sessions through one proxy, {rounds} cuts; backoff: exponential with "
            f"full jitter, first reconnect uniform in [0, {ceiling:g}] s "
            f"(reconnect_min_s {settings.reconnect_min_s:g}, max {settings.reconnect_max_s:g})"
        )
        for lock_step, label in ((False, "configured backoff"), (True, "anchor: lock-step")):
            arrived: list[float] = []
            connected: list[float] = []
            for _ in range(rounds):
                tcp, up = await storm(settings, clients, lock_step)
                arrived += tcp
                connected += up
            show(f"{label}, TCP at the proxy", arrived, clients, rounds)
            show(f"{label}, session connected", connected, clients, rounds)
    finally:
        await store.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # 2 x clients x rounds lines saying that a link was reset: the cut, on purpose.
    logging.getLogger("agent").setLevel(logging.ERROR)
    asyncio.run(main_async(args.clients, args.rounds))


if __name__ == "__main__":
    main()
