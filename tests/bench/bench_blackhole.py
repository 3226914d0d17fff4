"""A black-holed active: how soon it notices, how early it stops, how soon the standby takes over.

    python -m tests.bench.bench_blackhole [--rounds 5] [--keepalive-s 2] [--ttl-ms 3000]

A pair of real agent processes serves one fake thermostat through the embedded state store,
which runs in this process (tests/support/rig.py); each agent reaches the broker through a
fault proxy of its own. A round: the active's link becomes a black hole (nothing is closed,
nothing comes back), the standby takes over, the link comes back, the former active is the
standby of the next round. Per round:

- noticed: from the black hole to the active's "lost its connection" line, beside the bound
  1.5 x keep-alive;
- stopped: from the active's last renewal the store accepted to its "stepped down to
  standby" line (its local monotonic lease deadline), beside that lease's expiry as the store
  holds it (the renewal's arrival + TTL, read from the store's own entry): the margin by which
  it stopped before the store could hand the lock to anyone else, which must be > 0;
- takeover: from the black hole to the store's grant of the lock to the standby, beside
  TTL + 300 ms (as bench_failover), and from the store's expiry of the old lease to that grant.

Times of the agents' lines are their log timestamps (wall clock, 1 ms), brought onto this
process's monotonic clock with the offset measured at the start.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.support.processes import AgentProcess
from tests.support.rig import ACTIVE, LOCK_KEY, STANDBY, STEPPED_DOWN, Rig

LOST = re.compile(r"lost its connection to")
RECONNECTED = re.compile(r"reconnected to the broker")
LOCK = LOCK_KEY.encode()


@dataclass
class Grant:
    at: float  # monotonic, when the store accepted the SET
    holder: str  # instance id
    expires_at: float  # monotonic, the store's expiry of the lease it set


class LockLog:
    """Every SET of the lock the store accepted, with the expiry the store gave it (a hook on
    the store's pure core, as tests/soak/run.py installs one)."""

    def __init__(self, rig: Rig) -> None:
        self.grants: list[Grant] = []
        pure = rig.store.store
        handle = pure.handle

        def watched(client: str, payload: bytes, ts: Any = None, token: Any = None) -> Any:
            outcome = handle(client, payload, ts, token)
            if LOCK in payload and outcome.reply.payload == b"+OK\r\n":
                entry = pure.entry(LOCK)
                if entry is not None and entry.expires_at_ms is not None:
                    holder = entry.value.split(b"#", 1)[0].decode(errors="replace")
                    self.grants.append(Grant(time.monotonic(), holder, entry.expires_at_ms / 1000))
            return outcome

        pure.handle = watched  # type: ignore[method-assign]

    def last_by(self, holder: str, before: float) -> Grant | None:
        accepted = [g for g in self.grants if g.holder == holder and g.at <= before]
        return accepted[-1] if accepted else None

    def first_by(self, holder: str, after: float) -> Grant | None:
        return next((g for g in self.grants if g.holder == holder and g.at > after), None)


_OFFSET = time.time() - time.monotonic()


def stamp(line: str) -> float:
    """The monotonic time of an agent's log line, from its timestamp."""
    wall = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return wall - _OFFSET


def line_of(process: AgentProcess, pattern: re.Pattern[str], timeout: float) -> str:
    match = process.wait_for_new(pattern, timeout=timeout)
    return match.string


def bench(rounds: int, keepalive_s: int, ttl_ms: int) -> dict[str, list[float]]:
    ttl_s = ttl_ms / 1000
    figures: dict[str, list[float]] = {
        "noticed": [],
        "stopped": [],
        "store_expiry": [],
        "margin": [],
        "takeover": [],
        "after_expiry": [],
    }
    options = {"AGENT_MQTT__KEEPALIVE_S": str(keepalive_s)}
    with tempfile.TemporaryDirectory(prefix="bench-blackhole-") as tmp:
        rig = Rig(Path(tmp), ttl_ms=ttl_ms)
        try:
            locks = LockLog(rig)
            active, _ = rig.start_active("a", via_proxy=True, **options)
            standby = rig.start_agent("b", via_proxy=True, **options)
            standby.wait_for_new(STANDBY, timeout=20)
            names = {id(active): "a", id(standby): "b"}
            for n in range(rounds):
                time.sleep(ttl_s)  # a few renewals in steady state
                name, other = names[id(active)], names[id(standby)]
                proxy = rig.proxies[name]
                holed_at = rig.background.call(lambda p=proxy: (p.blackhole(), time.monotonic())[1])
                lost_at = stamp(line_of(active, LOST, 10 * keepalive_s))
                stopped_at = stamp(line_of(active, STEPPED_DOWN, 3 * ttl_s + 10))
                standby.wait_for_new(ACTIVE, timeout=3 * ttl_s + 10)
                grant = locks.first_by(other, holed_at)
                renewal = locks.last_by(name, holed_at)
                assert grant is not None and renewal is not None, (grant, renewal)
                figures["noticed"].append(lost_at - holed_at)
                figures["stopped"].append(stopped_at - renewal.at)
                figures["store_expiry"].append(renewal.expires_at - renewal.at)
                figures["margin"].append(renewal.expires_at - stopped_at)
                figures["takeover"].append(grant.at - holed_at)
                figures["after_expiry"].append(grant.at - renewal.expires_at)
                print(
                    f"  round {n + 1}: {name} noticed {figures['noticed'][-1] * 1000:5.0f} ms, "
                    f"stopped {figures['stopped'][-1] * 1000:5.0f} ms after its last renewal "
                    f"(store expiry {figures['store_expiry'][-1] * 1000:5.0f} ms, margin "
                    f"{figures['margin'][-1] * 1000:4.0f} ms), {other} took over "
                    f"{figures['takeover'][-1] * 1000:5.0f} ms after the black hole",
                    flush=True,
                )
                rig.background.call(proxy.set_pass)
                active.wait_for_new(RECONNECTED, timeout=20)
                active, standby = standby, active
            died = [p.proc.args for p in rig.agents if p.proc.poll() is not None]
            assert not died, f"agents exited: {died}"
        finally:
            rig.close()
    return figures


def show(label: str, values: list[float], bound: str, met: bool | None) -> None:
    verdict = "" if met is None else ("met" if met else "NOT MET")
    print(
        f"  {label:<34} median {statistics.median(values) * 1000:6.0f} ms, "
        f"min {min(values) * 1000:6.0f}, max {max(values) * 1000:6.0f}   {bound} {verdict}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keepalive-s", type=int, default=2)
    parser.add_argument("--ttl-ms", type=int, default=3000)
    args = parser.parse_args()
    ttl_s = args.ttl_ms / 1000
    print(f"keep-alive {args.keepalive_s} s, TTL {args.ttl_ms} ms, {args.rounds} rounds")
    f = bench(args.rounds, args.keepalive_s, args.ttl_ms)
    print()
    bound = 1.5 * args.keepalive_s
    show("dead link noticed", f["noticed"], f"(bound 1.5 x keep-alive {bound * 1000:.0f} ms)",
         max(f["noticed"]) <= bound)  # fmt: skip
    show("last renewal -> stopped driving", f["stopped"],
         f"(store expiry of that lease: median {statistics.median(f['store_expiry']) * 1000:.0f}"
         " ms after it)", None)  # fmt: skip
    show("stopped before the store's expiry", f["margin"], "(bound > 0 ms)", min(f["margin"]) > 0)
    show("takeover after the black hole", f["takeover"], f"(bound TTL + 300 ms "
         f"{(ttl_s + 0.3) * 1000:.0f} ms)", max(f["takeover"]) <= ttl_s + 0.3)  # fmt: skip
    show("takeover after the store's expiry", f["after_expiry"], "", None)


if __name__ == "__main__":
    main()
