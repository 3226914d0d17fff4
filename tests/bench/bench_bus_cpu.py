"""Figure: what the bus's own thread costs a transaction, polling flat out, beside the bound
of 0.3 ms of CPU a transaction (a line of 32 at 9600 baud in 1 % of a core).

    python -m tests.bench.bench_bus_cpu [--protocols line,modbus] [--bauds 9600,19200]
        [--units 32] [--seconds 8] [--profile]

The fake line is a process of its own (`agent sim-device --pty ... --emulate-baud B`), so its
CPU is not counted; the bus (agent.line.bus, the driver, the port) runs here on a pty, as it
does in the agent, with nothing else on its event loop: no store, no sync, no health. The
figure is the bus thread's run time (/proc/self/task/TID/schedstat, ns) over the
transactions the driver made in the window, and its split into user and system time; beside
it the whole process's. `--profile` adds the functions the bus thread spent its time in
(cProfile) and its calls a transaction.

Beside each cell, its floor on this machine: a thread of Python that does only what a
transaction must, on the same fake line (the driver's own request bytes, precomputed, written
with one os.write, the reply awaited with select and read until it is whole, the line's
silent interval waited out on a timed wait), and nothing else: no decoding, no checks, no
gate, no bus. What the bus costs above it is its own work.

Where the whole agent's figure is (the bus with the sync, the store and health beside it):
tests/bench/bench_write_path.py.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.controller import line_protocol as lp
from agent.controller import modbus_rtu as rtu
from agent.controller.driver import Driver, Unit
from agent.controller.line_driver import LineDriver
from agent.controller.modbus_driver import ModbusDriver
from agent.line.bus import Bus
from tests.bench.line_cells import load_average, parse_list

BOUND_MS = 0.3


def thread_run_s(tid: int) -> float:
    return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]) / 1e9


def thread_user_system_s(tid: int) -> tuple[float, float]:
    stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def start_fake(protocol: str, baud: int, units: int, link: Path) -> subprocess.Popen[str]:
    fake = subprocess.Popen(
        [
            sys.executable, "-m", "agent", "sim-device", "--pty", str(link),
            "--units", str(units), "--emulate-baud", str(baud),
            *(["--modbus"] if protocol == "modbus" else []),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert fake.stdout is not None
    fake.stdout.readline()  # ready
    return fake


def requests_of(driver: Driver, units: int) -> list[tuple[bytes, int]]:
    """Each unit's poll: its request's bytes and its reply's length (0: up to a newline)."""
    polls: list[tuple[bytes, int]] = []
    for n in range(1, units + 1):
        if isinstance(driver, ModbusDriver):
            m, reads = driver._unit_map(Unit(f"t{n:02}", n))
            for function, first, count in reads:
                request = rtu.read_request(m.unit_id, function, first, count)
                polls.append((request, rtu.reply_bytes(request)))
        else:
            line = lp.encode_line(lp.with_address(n, lp.format_request(lp.GetState())))
            polls.append((line, 0))
    return polls


def floor_loop(
    fd: int, polls: list[tuple[bytes, int]], silent_s: float, stop: Any, counted: list[int]
) -> None:
    """The floor: the polls' system calls and waits in a thread of Python, nothing more."""
    import select
    import threading

    pause = threading.Event()
    while not stop.is_set():
        for request, length in polls:
            os.write(fd, request)
            got = b""
            while True:
                ready, _, _ = select.select([fd], [], [], 1.0)
                if not ready:
                    break
                got += os.read(fd, 512)
                if (length and len(got) >= length) or (not length and got.endswith(b"\n")):
                    break
            counted[0] += 1
            pause.wait(silent_s)


async def floor_cell(protocol: str, baud: int, units: int, seconds: float) -> float:
    """The floor's CPU a transaction (ms), on a fake line of its own."""
    import termios
    import threading

    link = Path(tempfile.mkdtemp(prefix="bus-floor-")) / "line"
    fake = await asyncio.to_thread(start_fake, protocol, baud, units, link)
    try:
        driver: Driver = (ModbusDriver if protocol == "modbus" else LineDriver)(
            str(link), baudrate=baud, parity="N"
        )
        polls = requests_of(driver, units)
        fd = os.open(str(link), os.O_RDWR | os.O_NOCTTY)
        attrs = termios.tcgetattr(fd)
        attrs[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN)
        attrs[0] &= ~(termios.ICRNL | termios.IXON)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
        stop = threading.Event()
        counted = [0]
        thread = threading.Thread(
            target=floor_loop, args=(fd, polls, driver.timing.silent_s, stop, counted)
        )
        thread.start()
        await asyncio.sleep(1.0)
        tid = thread.native_id
        assert tid is not None
        before = (counted[0], thread_run_s(tid))
        await asyncio.sleep(seconds)
        after = (counted[0], thread_run_s(tid))
        stop.set()
        await asyncio.to_thread(thread.join, 5)
        os.close(fd)
    finally:
        fake.terminate()
        fake.wait(10)
    return 1000 * (after[1] - before[1]) / max(1, after[0] - before[0])


async def cell(protocol: str, baud: int, units: int, seconds: float, profile: bool) -> str:
    link = Path(tempfile.mkdtemp(prefix="bus-cpu-")) / "line"
    fake = await asyncio.to_thread(start_fake, protocol, baud, units, link)
    profiler = cProfile.Profile() if profile else None
    original = Bus._drive
    if profiler is not None:

        def drive(bus: Bus) -> None:
            profiler.enable()
            try:
                original(bus)
            finally:
                profiler.disable()

        Bus._drive = drive  # type: ignore[method-assign,assignment]
    try:
        driver: Driver = (ModbusDriver if protocol == "modbus" else LineDriver)(
            str(link), baudrate=baud, parity="N"
        )
        bus = Bus(driver, [Unit(f"t{n:02}", n) for n in range(1, units + 1)], poll_interval_s=0.001)
        await bus.open()
        await asyncio.sleep(1.0)  # past the first cycle's start
        thread: Any = bus._thread
        tid = thread.native_id
        before = (driver.stats.transactions, thread_run_s(tid), time.process_time())
        split_before = thread_user_system_s(tid)
        await asyncio.sleep(seconds)
        after = (driver.stats.transactions, thread_run_s(tid), time.process_time())
        split_after = thread_user_system_s(tid)
        await bus.close()
    finally:
        Bus._drive = original  # type: ignore[method-assign]
        fake.terminate()
        fake.wait(10)
    count = after[0] - before[0]
    bus_ms = 1000 * (after[1] - before[1]) / count
    process_ms = 1000 * (after[2] - before[2]) / count
    user, system = (split_after[i] - split_before[i] for i in (0, 1))
    verdict = "met" if bus_ms <= BOUND_MS else "MISSED"
    floor_ms = await floor_cell(protocol, baud, units, seconds)
    line = (
        f"{protocol:7} {baud:6} {units:4} {count:6} {bus_ms:9.3f} {BOUND_MS:6.1f} {verdict:7}"
        f" {user:5.2f} {system:5.2f} {process_ms:9.3f} {floor_ms:9.3f}"
    )
    if profiler is not None:
        stats = pstats.Stats(profiler)
        line += f"\n  calls a transaction: {stats.total_calls / max(1, count):.0f}"  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(15)
    return line


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocols", default="line,modbus")
    parser.add_argument("--bauds", default="9600,19200")
    parser.add_argument("--units", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--profile", action="store_true")
    options = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load {load_average()}")
    print(
        f"{'proto':7} {'baud':>6} {'N':>4} {'tx':>6} {'bus ms/tx':>9} {'bound':>6} {'':7}"
        f" {'user':>5} {'sys':>5} {'proc ms/tx':>9} {'floor ms/tx':>9}"
    )
    for protocol in options.protocols.split(","):
        for baud in parse_list(options.bauds):
            said = await cell(protocol, baud, options.units, options.seconds, options.profile)
            print(said, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
