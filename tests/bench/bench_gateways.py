"""Failover figures on booted gateways, each beside its bound.

    sudo .venv/bin/python -m tests.bench.bench_gateways [--kills N] [--stops N]
        [--switchovers N] [--upgrades N]

Two Debian 12 containers with systemd as PID 1 (tests/deploy/gateways.py), the Debian package
built by deploy/build-deb.sh and deployed with the project's playbook, serving one line of
eight thermostats (`agent sim-device --units 8` on this host, as a serial device server), the
state store (`agent emulator`) on this host, the default lease (AGENT_LOCK__TTL_MS=3000).
Times are taken on this host: a command's start, and the arrival of the lock's changes through
`agent store watch` (KEYNOTIFY).

1. Takeover after `systemctl kill -s KILL agent@floor3` on the active gateway: from the
   command until the standby holds the lock. Bound: TTL + 300 ms.
2. Handover on `systemctl stop agent@floor3` on the active gateway: from the command until
   the standby holds the lock. Bound: 300 ms.
3. Switchover: `agent switchover floor3` on this host: from the command's request until the
   new holder's lock (as the command prints it), and the time without an active (the lock's
   release until it is taken, as the watch sees them). Bound: 300 ms each.
4. Upgrade handover: `apt-get install ./agent_X.deb` on the active gateway (the next version,
   then reinstalls): the time without an active, from the old agent's release of the lock
   until the standby holds it. Bound: 300 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tests.deploy.gateways import requirements
from tests.deploy.pair import (
    HANDOVER_BOUND_S,
    TTL_S,
    PairSite,
    gaps_without_active,
)


def summary(name: str, samples: list[float], bound_s: float) -> str:
    median, worst = statistics.median(samples), max(samples)
    verdict = "ok" if worst <= bound_s else "MISSED"
    return (
        f"{name:<34} {median * 1000:8.0f} {worst * 1000:8.0f} {bound_s * 1000:8.0f}"
        f"  {verdict} (n={len(samples)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--stops", type=int, default=10)
    parser.add_argument("--switchovers", type=int, default=10)
    parser.add_argument("--upgrades", type=int, default=5)
    args = parser.parse_args()
    reason = requirements()
    if reason:
        print(f"bench_gateways: {reason}", file=sys.stderr)
        return 2

    started = time.monotonic()
    with PairSite() as site:
        print(f"packages {site.packages.old_version} and {site.packages.new_version}; ", end="")
        site.deploy(site.packages.old)
        print(f"pair deployed in {time.monotonic() - started:.0f} s", flush=True)

        kills = [site.takeover_after_kill()[0] for _ in range(args.kills)]
        stops = [site.handover_on_stop()[0] for _ in range(args.stops)]
        switchovers = [site.switchover() for _ in range(args.switchovers)]
        upgrades: list[float] = []
        for number in range(args.upgrades):
            active, _ = site.roles()
            # The next version on each gateway first, then reinstalls of it (the same path:
            # the old agent is stopped by the package's prerm, started again by its postinst).
            installed = site[active].run("dpkg-query", "-W", "-f", "${Version}", "agent").stdout
            options = ("--reinstall",) if installed == site.packages.new_version else ()
            events = site.upgrade(active, site.packages.new, *options)
            gaps = gaps_without_active(events)
            if len(gaps) != 1:
                print(f"upgrade {number}: unexpected lock changes {events}", file=sys.stderr)
                return 1
            upgrades.extend(gaps)

    print(f"{'figure':<34} {'median':>8} {'max':>8} {'bound':>8}  (ms)")
    print(summary("takeover after SIGKILL", kills, TTL_S + HANDOVER_BOUND_S))
    print(summary("handover on systemctl stop", stops, HANDOVER_BOUND_S))
    if switchovers:
        requested = [s[0] for s in switchovers]
        print(summary("switchover (request to new holder)", requested, HANDOVER_BOUND_S))
        gaps = [s[1] for s in switchovers]
        print(summary("switchover (no active)", gaps, HANDOVER_BOUND_S))
    print(summary("upgrade handover (no active)", upgrades, HANDOVER_BOUND_S))
    print(f"total {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
