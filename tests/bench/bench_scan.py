"""Figures: a whole bus scan's sweep time, addresses 1..247 at 9600 baud, beside the line's
physical floor, for both protocols.

    python -m tests.bench.bench_scan [--units N] [--baud B] [--reply-timeout-ms MS]

The fake line runs as `agent sim-device --addresses ... --emulate-baud B --tcp 0` (32 units
at mixed addresses by default, one pair of them colliding), a process of its own; the scan
runs as `agent scan`, a process of its own, with its default reply timeout. Each row:

- "sweep": the scan's own wall time for the sweep, as it prints it;
- "floor": the line's physical floor for the same transactions (each request's and
  reply's line time, a typical turnaround and the silent interval), as it prints it;
- "timeout": the reply timeout a dead address costs; "reply": the units' mean reply time
  (request sent to the reply's last byte).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time

PROTOCOLS = ("line", "modbus")


def addresses(units: int) -> list[int]:
    """`units` addresses spread over 1..247 (mixed, not 1..N)."""
    step = 247 / units
    return sorted({min(247, 1 + round(i * step)) for i in range(units)})


def run(protocol: str, units: int, baud: int, timeout_ms: float | None) -> dict[str, float]:
    chosen = addresses(units)
    fake = subprocess.Popen(
        [
            sys.executable, "-m", "agent", "sim-device", "--tcp", "0",
            "--addresses", ",".join(map(str, chosen)), "--doubled", str(chosen[len(chosen) // 2]),
            "--emulate-baud", str(baud), *(["--modbus"] if protocol == "modbus" else []),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert fake.stdout is not None
        url = fake.stdout.readline().split()[1]
        parity = "E" if protocol == "modbus" else "N"
        started = time.monotonic()
        scan = subprocess.run(
            [
                sys.executable, "-m", "agent", "scan", url, "--protocol", protocol,
                "--baud", str(baud), "--parity", parity, "--profile", "sim", "--no-store",
                *(["--reply-timeout-ms", str(timeout_ms)] if timeout_ms else []),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )  # fmt: skip
        wall = time.monotonic() - started
    finally:
        fake.terminate()
        fake.wait()
    summary = re.search(
        r"(\d+) units .* in ([\d.]+) s; the line's floor ([\d.]+) s \((\d+) transactions; "
        r"a dead address costs (\d+) ms",
        scan.stdout,
    )
    if summary is None:
        raise SystemExit(f"no summary in the scan's output:\n{scan.stdout}{scan.stderr}")
    replies = [float(t) for t in re.findall(r"reply +([\d.]+) ms", scan.stdout)]
    found = int(summary.group(1))
    return {
        "found": found,
        "sweep": float(summary.group(2)),
        "floor": float(summary.group(3)),
        "transactions": int(summary.group(4)),
        "timeout_ms": float(summary.group(5)),
        "reply_ms": sum(replies) / len(replies) if replies else 0.0,
        "wall": wall,
        "collision": float(bool(re.search(r"COLLISION", scan.stdout))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=32)
    parser.add_argument("--baud", type=int, default=9600)
    parser.add_argument("--reply-timeout-ms", type=float)
    args = parser.parse_args()
    print(
        f"scan of 1..247 at {args.baud} baud, {args.units} units at mixed addresses "
        "(one address doubled: a collision)"
    )
    print(
        f"{'protocol':<9}{'found':>6}{'tx':>6}{'sweep s':>9}{'floor s':>9}{'ratio':>7}"
        f"{'timeout ms':>12}{'reply ms':>10}{'collision':>11}"
    )
    for protocol in PROTOCOLS:
        figures = run(protocol, args.units, args.baud, args.reply_timeout_ms)
        print(
            f"{protocol:<9}{figures['found']:>6.0f}{figures['transactions']:>6.0f}"
            f"{figures['sweep']:>9.1f}{figures['floor']:>9.1f}"
            f"{figures['sweep'] / figures['floor']:>7.1f}{figures['timeout_ms']:>12.0f}"
            f"{figures['reply_ms']:>10.1f}{'yes' if figures['collision'] else 'no':>11}"
        )


if __name__ == "__main__":
    main()
