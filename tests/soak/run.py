"""A soak run: a pair serving a line under load and random faults, checked throughout.

    python tests/soak/run.py --seconds 60 --seed 1 [--shape multidrop|p2p] [--units 8]
        [--ttl-ms 3000] [--min-write-interval-s 0.5] [--emulate-baud 115200]
        [--faults all|pair,unit,combined,<kind>...] [--no-load] [--logs DIR]
        [--agent-log-level DEBUG]

Everything runs on this machine: the embedded state store (kept on disk, so that a restart
can keep or lose its contents) and the fake line (TCP, as a serial device server with a port
for each master: every transaction on the wire names the instance that sent it) in this
process, the two agents as real processes, each reaching the broker through a fault proxy
of its own (tests/soak/world.py).

Shapes: `multidrop` (N addressed units, `--units`) or `p2p` (one unaddressed controller,
configured as a single device). The agents run at 115200 baud and the fake line holds each
transaction for its line time at that rate (`--emulate-baud`, 0 for none): at 9600 baud a
transaction takes about 70 ms, so a line of 32 could not carry the load below (one change a
unit a second is a read and a write each, 64 transactions a second, 4.5 s of line time a
second); at 115200 it takes about 6 ms, the load fits beside the polls, and every
transaction still has a real span on the wire (first byte to last) for the lease check.

Each unit is a whole thermostat (the built-in profile `sim`): the agents keep its set point,
heating and cooling set points, mode, fan and occupancy, each in its key (`--points` names
those the load changes; `--points setPoint` configures no profile, the set point alone).

Load (tests/soak/load.py), on a thread of its own, independent of the faults: one remote
change per unit per second, of a point dealt from a shuffled deck, fenced with the lock's
current version, and panel changes at random units and points (one per unit every four
seconds), some of them right after a remote change to the same point, within the unit's
least write interval (a panel change during a write wait).

Faults (tests/soak/faults.py), one at a time from a seeded catalogue: of the pair, its links
and the store (`pair`), of the units (`unit`: lost, late, slow, garbled replies and line
noise, which exercise the driver's waits), and combinations where a second fault hits while
the pair is still recovering from the first (`combined`). After each single fault the pair is
whole again before the next.

Checks: the checker (tests/soak/checker.py), fed only by the fake line's records and the
store's own record of writes, never by the agents: one master on the line, the newest token
on every write, no change of any point lost or reverted, and every transaction an instance
put on the line within a lease the store granted it. Liveness (tests/soak/liveness.py) is
sampled every 25 ms throughout: a gap with no active instance is held against its fault's
bound. Each fault's recovery (until an instance holds the lease by a grant or renewal since
the fault ended, or the unit answers again) is held against the same bound. When the time
is up the load and the faults stop, and every point of every device must come to agree.

The last line printed is one JSON object: the configuration, the faults injected by kind,
the load made by kind and by point, what the checker checked (the changes of each point),
violations (target 0) with the first ones' details, changes lost (target 0), recovery times
(p50/p99) and the worst time with no active per fault kind, and the soak process's own
pauses (its longest garbage collection, its store's longest stall: tests/soak/pauses.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.soak.faults import UNIT_BOUND_S, Injector, catalogue
from tests.soak.liveness import SLACK_S, Sampler, describe, judge, report
from tests.soak.load import Load
from tests.soak.pauses import Pauses
from tests.soak.world import (
    LINE,
    POINTS,
    PROBE_S,
    SHAPES,
    Agent,
    World,
    device_id,
    wait_until,
)

__all__ = ["LINE", "Agent", "World", "device_id", "run", "wait_until"]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(
    seconds: float,
    seed: int,
    units: int = 4,
    ttl_ms: int = 3000,
    *,
    shape: str = "multidrop",
    min_write_interval_s: float = 0.5,
    emulate_baud: int | None = 115_200,
    faults: str = "all",
    load: bool = True,
    logs: Path | None = None,
    agent_log_level: str = "INFO",
    points: tuple[str, ...] = POINTS,
) -> dict[str, Any]:
    rng = random.Random(seed)
    weights = catalogue(faults)
    ttl_s = ttl_ms / 1000
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        world = World(
            Path(tmp),
            units,
            ttl_ms,
            rng,
            shape=shape,
            min_write_interval_s=min_write_interval_s,
            emulate_baud=emulate_baud or None,
            log_level=agent_log_level,
            points=points,
        )
        sampler = Sampler(world.live, world.collect)
        pauses = Pauses()
        pauses.start(world.background.loop)
        generator = Load(world, seed) if load else None
        spans = []
        details: list[str] = []
        try:
            world.start_agent("a")
            assert wait_until(world.driving, 30), "no active at start"
            world.start_agent("b")
            sampler.start()
            if generator is not None:
                generator.start()
            injector = Injector(world, weights)
            ends_at = time.monotonic() + seconds
            next_fault = time.monotonic() + rng.uniform(1, 3) * ttl_s
            while weights and time.monotonic() < ends_at:
                time.sleep(max(0.0, min(next_fault, ends_at) - time.monotonic()))
                if time.monotonic() >= ends_at:
                    break
                # The pair is whole again (a killed instance back as the standby) before
                # the next fault; a combination makes its own second fault.
                wait_until(world.whole, 30)
                span, unit = injector.inject(injector.pick())
                world.stats.faults[span.kind] += 1
                spans.append(span)
                recover(world, span, unit)
                next_fault = time.monotonic() + rng.uniform(1, 2) * ttl_s
            if generator is not None:
                generator.stop()
            summary = world.settle_and_check()
            sampler.stop()
            judged = judge(sampler.gaps, spans, ttl_s)
            for item in judged:
                if item.violation:
                    details.append(describe(item))
            violations_shown = summary["first_violations"] + details[:5]
            if logs is not None:
                world.write_logs(logs)
                (logs / "faults.txt").write_text(
                    "".join(f"{f.started:.3f} {f.ended:.3f} {f.kind}\n" for f in spans)
                )
                (logs / "gaps.txt").write_text("".join(f"{describe(j)}\n" for j in judged))
                (logs / "checker.txt").write_text(
                    "".join(f"{v.at:.3f} {v.kind}: {v.detail}\n" for v in world.checker.violations)
                )
                excerpts = [
                    (v.at, f"{v.kind}: {v.detail}") for v in world.checker.violations[:5]
                ] + [(item.gap.start, describe(item)) for item in judged if item.violation][:5]
                with (logs / "violations.txt").open("w") as out:
                    for at, text in excerpts:
                        out.write(f"== {text}\n")
                        for slot in sorted({int(n) for n in re.findall(r"\bs(\d\d)\b", text)}):
                            out.write(f"-- s{slot:02d} as the line and the store saw it\n")
                            out.write("\n".join(world.timeline(slot, at)) + "\n")
                        out.write("-- the agents' lines\n")
                        out.write("\n".join(world.logs_around(at)) + "\n\n")
        finally:
            if generator is not None:
                generator.stop()
            sampler.stop()
            pauses.stop()
            world.close()
    stats = world.stats
    over = [item for item in judged if item.violation]
    violations = summary["violations"] + len(stats.died) + len(stats.not_recovered) + len(over)
    return {
        "seconds": seconds,
        "seed": seed,
        "shape": shape,
        "units": world.units,
        "ttl_ms": ttl_ms,
        "min_write_interval_s": min_write_interval_s,
        "emulate_baud": emulate_baud or None,
        "poll_interval_s": world.poll_interval_s,
        "faults": dict(sorted(stats.faults.items())),
        "points": list(world.kept),
        "load": dict(sorted(generator.made.items())) if generator is not None else {},
        "load_by_point": (
            {point: dict(made) for point, made in generator.by_point.items()}
            if generator is not None
            else {}
        ),
        "checked": {
            **summary["checked"],
            "liveness samples": sampler.samples,
            "liveness worst sampling step ms": round(sampler.worst_step_s * 1000),
            **pauses.report(),
        },
        "violations": violations,
        "violations_by_kind": {
            **summary["violations_by_kind"],
            **({"process_died": len(stats.died)} if stats.died else {}),
            **({"not_recovered_in_time": len(stats.not_recovered)} if stats.not_recovered else {}),
            **({"no_active_too_long": len(over)} if over else {}),
        },
        "lost": summary["lost"],
        "raced_panel_changes": summary["raced_panel_changes"],
        "recovery_ms": {
            kind: {
                "p50": round(quantile(values, 0.5) * 1000),
                "p99": round(quantile(values, 0.99) * 1000),
                "n": len(values),
            }
            for kind, values in sorted(stats.recovery.items())
        },
        "no_active": report(judged),
        "sampler_errors": sampler.errors,
        "took_s": round(time.monotonic() - began),
        "details": violations_shown + stats.died[:5] + stats.not_recovered[:5],
    }


def recover(world: World, span: Any, unit: int | None) -> None:
    """Waits until the line is served again after `span`: an instance holds the lease by a
    grant or renewal since the fault ended (a unit's fault: the unit, or any unit for the
    whole line, answered since); notes the time, and a miss of the bound."""
    ended = span.ended
    what = span.kind
    if unit is None:
        bound = span.bound_s
        took = wait_until(lambda: world.driving_since(ended), bound + 30)
        # Timed by the grant's own record: under load the harness may look late.
        granted = world.leased_at(ended) if took is not None else None
        if granted is None:  # the active changed meanwhile: when the harness saw it
            granted = None if took is None else time.monotonic()
        recovered = None if granted is None else granted - ended
    else:
        bound = unit_bound(world, span, unit)
        address = None if unit == 0 or world.shape == "p2p" else unit
        if unit:
            what += f" of s{unit:02d}"
        took = wait_until(lambda: world.line_answered_since(address, ended), bound + 30)
        recovered = time.monotonic() - ended if took is not None else None
    if recovered is None or recovered > bound:
        world.stats.not_recovered.append(
            f"{what} ended at {ended:.3f}: "
            f"{'never' if recovered is None else f'{recovered:.2f} s'} (bound {bound:.2f} s)"
        )
    if recovered is not None:
        world.stats.recovery[span.kind].append(recovered)


def unit_bound(world: World, span: Any, unit: int) -> float:
    """How soon a unit answers again after its fault: a quarantined unit is probed after
    PROBE_S, then each time twice as late (at most ten times PROBE_S); the next probe comes
    within twice the longest wait between the unit's transactions during the fault."""
    world.collect()
    stamps = [
        e.at
        for e in world.checker.line
        if span.started <= e.at <= span.ended and (unit == 0 or e.address == unit)
    ]
    longest = max(
        (b - a for a, b in itertools.pairwise([span.started, *stamps, span.ended])), default=0.0
    )
    return max(UNIT_BOUND_S, min(2 * longest, 10 * PROBE_S) + SLACK_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shape", choices=SHAPES, default="multidrop")
    parser.add_argument("--units", type=int, default=4, help="units of a multidrop line")
    parser.add_argument("--ttl-ms", type=int, default=3000)
    parser.add_argument("--min-write-interval-s", type=float, default=0.5)
    parser.add_argument(
        "--emulate-baud", type=int, default=115_200, help="line time at this rate (0: none)"
    )
    parser.add_argument(
        "--faults", default="all", help="groups (pair, unit, combined, all) and kinds, by commas"
    )
    parser.add_argument("--no-load", action="store_true", help="no remote or panel changes")
    parser.add_argument(
        "--logs", type=Path, help="write every instance's lines and the violations' context here"
    )
    parser.add_argument("--agent-log-level", default="INFO", help="the agents' AGENT_LOG_LEVEL")
    parser.add_argument(
        "--points",
        default=",".join(POINTS),
        help="the points the load changes, by commas (setPoint alone: no profile)",
    )
    args = parser.parse_args()
    try:
        catalogue(args.faults)
    except ValueError as exc:
        parser.error(str(exc))
    points = tuple(p.strip() for p in args.points.split(",") if p.strip())
    unknown = [p for p in points if p not in POINTS]
    if not points or unknown:
        parser.error(f"--points: some of {', '.join(POINTS)}, not {', '.join(unknown)}")
    result = run(
        args.seconds,
        args.seed,
        args.units,
        args.ttl_ms,
        shape=args.shape,
        min_write_interval_s=args.min_write_interval_s,
        emulate_baud=args.emulate_baud,
        faults=args.faults,
        load=not args.no_load,
        logs=args.logs,
        agent_log_level=args.agent_log_level,
        points=points,
    )
    for kind, count in sorted(result["faults"].items()):
        recovery = result["recovery_ms"].get(kind)
        gaps = result["no_active"].get(kind)
        shown = f"recovery p50 {recovery['p50']} ms, p99 {recovery['p99']} ms" if recovery else ""
        if gaps:
            shown += f"; no active at worst {gaps['worst_gap_ms']} ms"
        print(f"  {kind:<26} {count:>4}  {shown}", flush=True)
    for detail in result["details"]:
        print(f"  ! {detail}", flush=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
