"""What Prometheus's scrape costs the agent: the active of a line of N = 32 thermostats.

    python -m tests.bench.bench_metrics [--units N] [--window-s S] [--rounds R] [--burst B]

The rig's embedded state store and fake line (TCP) in this process, the agent a real
process with the shipped defaults (poll 1 s, telemetry 10 s, lease 3 s).

1. The agent's CPU (utime + stime, as a share of one core) over windows of S seconds, with
   no scrape and with a scrape of /metrics every 5 s, alternated R times (the median of
   each is shown: other work on the machine moves both).
2. One scrape's CPU in the agent: B scrapes back to back, the agent's CPU over them less
   its idle rate over the same time, divided by B; times one scrape per 5 s, the share of a
   core a scrape every 5 s costs. Bound: 0.2 % of a core.
"""

from __future__ import annotations

import argparse
import http.client
import re
import statistics
import tempfile
import time
from pathlib import Path

from tests.bench.footprint import cpu_seconds
from tests.support.rig import LineRig

SCRAPE_EVERY_S = 5.0
BOUND = 0.002  # of a core
ENDPOINT = re.compile(r"health endpoint at http://([\d.]+):(\d+)/health")
DEFAULTS = {
    "AGENT_SERIAL__POLL_INTERVAL_S": "1",
    "AGENT_TELEMETRY__INTERVAL_S": "10",
    "AGENT_LOCK__TTL_MS": "3000",
    "AGENT_HEALTH__PORT": "0",
}


def scrape(address: tuple[str, int]) -> int:
    connection = http.client.HTTPConnection(*address, timeout=5)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200, response.status
        return len(body)
    finally:
        connection.close()


def cpu_share(pid: int, window_s: float, address: tuple[str, int] | None) -> float:
    """The agent's CPU over `window_s`, as a share of one core; scraped every 5 s if given an
    address."""
    started, cpu = time.monotonic(), cpu_seconds(pid)
    next_scrape = started
    while (now := time.monotonic()) < started + window_s:
        if address is not None and now >= next_scrape:
            scrape(address)
            next_scrape += SCRAPE_EVERY_S
        time.sleep(min(0.5, max(0.0, started + window_s - now)))
    return (cpu_seconds(pid) - cpu) / (time.monotonic() - started)


def per_scrape_s(pid: int, address: tuple[str, int], burst: int, idle_share: float) -> float:
    started, cpu = time.monotonic(), cpu_seconds(pid)
    for _ in range(burst):
        scrape(address)
    elapsed = time.monotonic() - started
    return max(0.0, cpu_seconds(pid) - cpu - idle_share * elapsed) / burst


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--units", type=int, default=32)
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--burst", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rig = LineRig(Path(tmp), args.units)
        try:
            agent, _ = rig.start_active("a", **DEFAULTS)
            match = agent.wait_for(ENDPOINT)
            address = (match.group(1), int(match.group(2)))
            pid = agent.proc.pid
            time.sleep(5)  # past the takeover's reads and the first telemetry
            size = scrape(address)
            quiet, scraped = [], []
            for _ in range(args.rounds):
                quiet.append(cpu_share(pid, args.window_s, None))
                scraped.append(cpu_share(pid, args.window_s, address))
            one = per_scrape_s(pid, address, args.burst, statistics.median(quiet))
        finally:
            rig.close()
    cost = one / SCRAPE_EVERY_S
    print(f"agent, active of {args.units} units; /metrics is {size} bytes")
    print(f"  CPU, no scrape            {statistics.median(quiet) * 100:6.2f} % of a core")
    print(f"  CPU, a scrape every 5 s   {statistics.median(scraped) * 100:6.2f} % of a core")
    print(f"    (windows of {args.window_s:g} s, {args.rounds} each, medians)")
    print(f"  one scrape                {one * 1000:6.2f} ms of CPU ({args.burst} back to back)")
    verdict = "ok" if cost <= BOUND else "OVER"
    print(f"  a scrape every 5 s costs  {cost * 100:6.3f} % of a core (bound 0.2 %) {verdict}")


if __name__ == "__main__":
    main()
