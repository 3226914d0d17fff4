"""The pair through each fault: takeover time, time with no master, changes lost.

    python -m tests.bench.bench_failover [--rounds R] [--ttls 3000,1000] [--units 4]

For each lease TTL (the default, 3 s, and 1 s) and each fault, a pair of real agent
processes serves a line of fake thermostats (the soak's world: tests/soak/run.py, each agent
reaching the broker through a fault proxy). A round: the fault hits the active, a remote
change and a panel change (on two devices) are made while it lasts, the fault ends.

- takeover: for the faults that end an active (kill, pause, black hole), from the fault to
  the standby's lease grant, bound TTL + 300 ms; for the faults that end no one (a one-second
  link reset, a broker restart), from the end of the fault to the next grant or renewal, bound
  TTL + 300 ms (+ the lock delay, one TTL, when the store forgot the lock); for a burst of 20
  remote writes, from the last write to the last value on the thermostat;
- no master: the longest gap in the line's own records, from the fault until the next round
  (a gap is time no one polled the line);
- lost: changes lost, by the soak's checker (never by the agents' word), target 0.
"""

from __future__ import annotations

import argparse
import itertools
import random
import signal
import statistics
import tempfile
import time
from pathlib import Path

from tests.soak.run import LINE, Agent, World, device_id, wait_until

FAULTS = (
    "kill",
    "pause",
    "blackhole",
    "cut_1s",
    "broker_restart",
    "broker_restart_forget",
    "burst",
)
LOCK = f"{LINE}\\lock".encode()


def line_gap(world: World, since: float, until: float) -> float:
    """The longest time with no request on the line between `since` and `until`."""
    world.collect()
    stamps = sorted(e.at for e in world.checker.line if since <= e.at <= until)
    return max(b - a for a, b in itertools.pairwise([since, *stamps, until]))


def granted(world: World, after: float, *, other_than: str | None = None) -> float | None:
    """When the store next granted or renewed the lease after `after` (to anyone but
    `other_than`, when given)."""
    for event in world.checker.store:
        if event.key != LOCK or not event.accepted or event.at <= after:
            continue
        holder = (event.value or b"").split(b"#")[0].decode(errors="replace")
        if holder and holder != other_than:
            return event.at
    return None


def remote_and_panel_change(world: World, rng: random.Random) -> None:
    value = rng.choice([n / 2 for n in range(30, 60)])
    world.background.call(lambda: world.line.unit(2).panel_setpoint(value))
    lock = world.client.request("GET", f"{LINE}\\lock")
    token = lock.prop("__ts")
    if token is not None and lock.payload != b"$-1\r\n":
        remote = rng.choice([n / 2 for n in range(30, 60)])
        world.client.request("SET", f"{device_id(1)}\\setPoint", f"{remote:.1f}", ft=token)


def one_round(world: World, fault: str, rng: random.Random) -> float | None:
    """Carries out one fault; returns its figure in seconds (None: it never came)."""
    ttl_s = world.ttl_ms / 1000
    active = world.active()
    assert active is not None
    start = time.monotonic()
    limit = 3 * ttl_s + 10
    if fault in ("kill", "pause", "blackhole"):
        if fault == "kill":
            active.expected_exit = True
            active.process.signal(signal.SIGKILL)
        elif fault == "pause":
            active.stopped = True
            active.process.signal(signal.SIGSTOP)
        else:
            world.background.call(active.proxy.blackhole)
        remote_and_panel_change(world, rng)
        wait_until(lambda: granted(world, start, other_than=active.name) is not None, limit)
        took = granted(world, start, other_than=active.name)
        if fault == "kill":
            active.process.proc.wait(10)
            world.start_agent(active.name)
        elif fault == "pause":
            active.process.signal(signal.SIGCONT)
            active.stopped = False
        else:
            world.background.call(active.proxy.set_pass)
        return None if took is None else took - start
    if fault == "cut_1s":

        def reset() -> None:
            active.proxy.cut()
            active.proxy.drop()

        world.background.call(reset)
        remote_and_panel_change(world, rng)
        time.sleep(1.0)
        world.background.call(active.proxy.set_pass)
        ended = time.monotonic()
        wait_until(lambda: world.driving_since(ended), limit)
        took = granted(world, ended)
        return None if took is None else took - ended
    if fault in ("broker_restart", "broker_restart_forget"):
        world.restart_store(keep=fault == "broker_restart", outage_s=1.0)
        ended = time.monotonic()
        wait_until(lambda: world.driving_since(ended), limit)
        took = granted(world, ended)
        remote_and_panel_change(world, rng)
        return None if took is None else took - ended
    # burst: 20 remote changes to one device as fast as one client sends them
    token = world.client.request("GET", f"{LINE}\\lock").prop("__ts")
    last = 0.0
    for n in range(20):
        last = 15.0 + n / 2
        world.client.request("SET", f"{device_id(3)}\\setPoint", f"{last:.1f}", ft=token)
    sent = time.monotonic()
    unit = world.line.unit(3)
    took_s = wait_until(lambda: world.background.call(lambda: unit.setpoint) == last, limit)
    return None if took_s is None else time.monotonic() - sent


def bound_of(fault: str, ttl_s: float) -> float:
    if fault == "burst":
        return float("nan")  # reported against the line's write interval, below
    return ttl_s + 0.3 + (ttl_s if fault == "broker_restart_forget" else 0.0)


def bench(ttl_ms: int, units: int, rounds: int, seed: int, faults: tuple[str, ...]) -> None:
    rng = random.Random(seed)
    ttl_s = ttl_ms / 1000
    for fault in faults:
        with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
            world = World(
                Path(tmp), units, ttl_ms, rng, min_write_interval_s=0.2, emulate_baud=None
            )
            try:
                world.start_agent("a")
                assert wait_until(world.driving, 30), "no active at start"
                world.start_agent("b")
                time.sleep(2 * ttl_s)
                figures: list[float] = []
                gaps: list[float] = []
                missing = 0
                for _ in range(rounds):
                    start = time.monotonic()
                    figure = one_round(world, fault, rng)
                    if figure is None:
                        missing += 1
                    else:
                        figures.append(figure)
                    # Let the pair become whole again (a killed active is back as the
                    # standby) before the next round; the gap covers this time too.
                    wait_until(lambda w=world: w.driving() and len(_alive(w)) == 2, 30)
                    time.sleep(ttl_s)
                    gaps.append(line_gap(world, start, time.monotonic()))
                summary = world.settle_and_check()
                died = [a.name for a in world.agents.values() if _died(a)]
            finally:
                world.close()
        worst = max(figures) if figures else float("inf")
        if fault == "burst":
            verdict = f"(last value on the thermostat; {missing} never)"
        else:
            bound = bound_of(fault, ttl_s)
            met = "met" if worst <= bound and not missing else "NOT MET"
            verdict = f"(bound {bound * 1000:5.0f} ms) {met}"
        median = statistics.median(figures) * 1000 if figures else float("nan")
        print(
            f"  {fault:<22} median {median:6.0f} ms, max {worst * 1000:6.0f} ms {verdict:<24}"
            f" no master max {max(gaps) * 1000:6.0f} ms  lost {summary['lost']}"
            f"  violations {summary['violations']}{'  died: ' + ','.join(died) if died else ''}",
            flush=True,
        )
        for detail in summary["first_violations"]:
            print(f"      {detail}", flush=True)


def _alive(world: World) -> list[str]:
    return [a.name for a in world.agents.values() if a.process.proc.poll() is None]


def _died(agent: Agent) -> bool:
    return agent.process.proc.poll() not in (None, 0) and not agent.expected_exit


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ttls", default="3000,1000")
    parser.add_argument("--units", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default=",".join(FAULTS))
    args = parser.parse_args()
    faults = tuple(args.faults.split(","))
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    began = time.monotonic()
    for ttl_ms in (int(t) for t in args.ttls.split(",")):
        print(f"\nTTL {ttl_ms} ms, {args.units} devices, {args.rounds} rounds of each fault")
        bench(ttl_ms, args.units, args.rounds, args.seed, faults)
    print(f"\ntotal {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
