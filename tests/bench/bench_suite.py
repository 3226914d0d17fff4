"""Figure: the default test suite's wall time, as the README's test command runs it (in
parallel, as pytest's addopts say), beside its bound of 4 minutes and beside the same suite
run serially (`-n 0`), in one run of this script.

    python -m tests.bench.bench_suite [--no-serial] [--repeat N] [--beside 'COMMAND'] [--keep DIR]

`--beside` runs a command next to the suite for the whole run (a soak, say, to see the suite
on a loaded machine) and stops it after; the suite must pass all the same. `--repeat` runs the
parallel suite N times in a row (all beside the one command).

Prints, for each run: wall seconds, the CPU seconds it used (its processes and theirs), the
pytest summary line, and the ten slowest tests.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 240.0
SUMMARY = re.compile(r"^=* ?(\d+ (passed|failed).*) in [\d.]+s", re.M)


@dataclass
class Run:
    name: str
    wall_s: float
    cpu_s: float
    summary: str
    slowest: list[str]
    failed: list[str]
    returncode: int


def run_suite(name: str, *extra: str, keep: Path | None = None) -> Run:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=10"]
    done = subprocess.run(
        [*pytest, *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.monotonic() - started
    if keep is not None:  # the whole report, for a failure's details
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}.txt").write_text(
            done.stdout + done.stderr
        )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = SUMMARY.search(done.stdout)
    summary = found.group(1) if found else done.stdout.strip().splitlines()[-1:][0]
    slowest = re.findall(r"^\s*([\d.]+s (?:call|setup|teardown)\s+\S+)", done.stdout, re.M)
    failed = re.findall(r"^((?:FAILED|ERROR) .*)$", done.stdout, re.M)
    return Run(name, wall, cpu, summary, slowest[:10], failed, done.returncode)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-serial", action="store_true", help="skip the serial run")
    parser.add_argument("--beside", help="a command to run beside the suite (a soak, say)")
    parser.add_argument("--repeat", type=int, default=1, help="parallel runs in a row")
    parser.add_argument("--keep", type=Path, help="a directory to keep each run's whole report in")
    options = parser.parse_args()

    beside = None
    if options.beside:
        beside = subprocess.Popen(
            shlex.split(options.beside),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        runs = [
            run_suite(f"parallel (the README's command) #{n + 1}", keep=options.keep)
            for n in range(options.repeat)
        ]
        if not options.no_serial:
            runs.append(run_suite("serial (-n 0)", "-n", "0", keep=options.keep))
    finally:
        # Whether the command beside ran all along: one that ended early loaded nothing after.
        beside_ended = None if beside is None else beside.poll()
        if beside is not None:
            os.killpg(beside.pid, signal.SIGTERM)
            beside.wait(30)

    said = ""
    if beside is not None:
        how = "ran to the end" if beside_ended is None else f"ended early: {beside_ended}"
        said = f"; beside ({how}): {options.beside}"
    print(f"machine: {os.cpu_count()} cores{said}")
    print(f"{'run':34} {'wall s':>8} {'bound s':>8} {'cpu s':>8}  result")
    for run in runs:
        bound = f"{BOUND_S:8.0f}" if run.name.startswith("parallel") else f"{'':8}"
        print(f"{run.name:34} {run.wall_s:8.1f} {bound} {run.cpu_s:8.1f}  {run.summary}")
    if not options.no_serial:
        print(f"parallel / serial: {runs[0].wall_s / runs[-1].wall_s:.2f}")
    for run in runs:
        for line in run.failed:
            print(f"{run.name}: {line}")
    for run in runs:
        print(f"\nslowest, {run.name}:")
        for line in run.slowest:
            print(f"  {line}")
    return 0 if all(run.returncode == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
