"""A standby's start over a slow link to the store, and the takeover right after it.

    python -m tests.bench.bench_start [--delays 0,0.1,0.3,0.6,1.0] [--units 8,32] [--ttl 3000]

For each line (8 and 32 units, set points alone and whole thermostats) and each one-way
delay of the starting instance's link, the soak's world (tests/soak/world.py) serves the
line with an active on a fast link; a second instance starts through a fault proxy that
holds every byte for the delay each way. Two figures:

- start: from the process's start to its "started as standby", beside its bound of 1.5 s
  (the interpreter, the settings, the line's driver) + 6 round trips;
- takeover: the active is killed right after that start; from the kill to the store's grant
  of the lock to the new instance, beside TTL + 1.5 round trips (the lease runs out at the
  store, its DELETE reaches the standby, whose SET comes back granted). "driving" is from
  the kill to its "became active" (its devices' keys watched, the line open).

Each run has its own world; the whole bench takes a few minutes.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import tempfile
import time
from pathlib import Path

from tests.bench.bench_failover import granted
from tests.soak.world import ACTIVE, POINTS, SET_POINT, World, wait_until

STANDBY = re.compile(r"started as standby")
START_BOUND_S = 1.5
START_ROUND_TRIPS = 6
TAKEOVER_ROUND_TRIPS = 1.5


def slow_link_env(one_way_s: float) -> dict[str, str]:
    """Timeouts that a link this slow can meet (a request waits behind a few dozen)."""
    round_trip = 2 * one_way_s
    return {
        "AGENT_MQTT__REQUEST_TIMEOUT_S": str(max(2.0, 5 * round_trip)),
        "AGENT_MQTT__KEEPALIVE_S": str(max(2, round(5 * round_trip))),
        "AGENT_MQTT__CONNECT_TIMEOUT_S": str(max(2.0, 5 * round_trip)),
    }


def one_run(
    units: int, points: tuple[str, ...], one_way_s: float, ttl_ms: int
) -> tuple[float | None, float | None, float | None]:
    """(start, takeover, driving) in seconds, None for one that never came."""
    ttl_s = ttl_ms / 1000
    round_trip = 2 * one_way_s
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        world = World(
            Path(tmp),
            units,
            ttl_ms,
            random.Random(1),
            min_write_interval_s=0.2,
            emulate_baud=None,
            points=points,
        )
        try:
            world.start_agent("a")
            assert wait_until(world.driving, 30), "no active at start"
            began = time.monotonic()
            standby = world.start_agent("b", link_delay_s=one_way_s, env=slow_link_env(one_way_s))
            limit = 3 * (START_BOUND_S + START_ROUND_TRIPS * round_trip) + 10
            try:
                standby.process.wait_for(STANDBY, timeout=limit)
            except TimeoutError:
                return None, None, None
            started = time.monotonic() - began
            active = world.agents["a"]
            active.expected_exit = True
            killed = time.monotonic()
            active.process.signal(signal.SIGKILL)
            limit = 3 * (ttl_s + TAKEOVER_ROUND_TRIPS * round_trip) + 10
            wait_until(lambda: granted(world, killed, other_than="a") is not None, limit)
            grant = granted(world, killed, other_than="a")
            try:
                standby.process.wait_for(ACTIVE, timeout=limit)
                driving: float | None = time.monotonic() - killed
            except TimeoutError:
                driving = None
            return started, None if grant is None else grant - killed, driving
        finally:
            world.close()


def shown(figure: float | None, bound: float) -> str:
    if figure is None:
        return f"   never (bound {bound:5.1f} s) NOT MET"
    verdict = "met" if figure <= bound else "NOT MET"
    return f"{figure:6.2f} s (bound {bound:5.1f} s) {verdict:<7}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--delays", default="0,0.1,0.3,0.6,1.0")
    parser.add_argument("--units", default="8,32")
    parser.add_argument("--ttl", type=int, default=3000)
    args = parser.parse_args()
    ttl_s = args.ttl / 1000
    began = time.monotonic()
    print(f"TTL {args.ttl} ms; the active on a fast link, the starting standby delayed")
    for units in (int(n) for n in args.units.split(",")):
        for name, points in (("set points", (SET_POINT,)), ("whole thermostats", POINTS)):
            print(f"\n{units} units, {name}")
            for one_way_s in (float(d) for d in args.delays.split(",")):
                round_trip = 2 * one_way_s
                start, takeover, driving = one_run(units, points, one_way_s, args.ttl)
                start_bound = START_BOUND_S + START_ROUND_TRIPS * round_trip
                takeover_bound = ttl_s + TAKEOVER_ROUND_TRIPS * round_trip
                driven = "never" if driving is None else f"{driving:5.2f} s"
                print(
                    f"  {one_way_s:3.1f} s one way: start {shown(start, start_bound)}"
                    f"  takeover {shown(takeover, takeover_bound)}  driving {driven}",
                    flush=True,
                )
    print(f"\ntotal {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
