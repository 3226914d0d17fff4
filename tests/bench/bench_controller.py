"""Figures: a set point write with its read-back, over a pty, beside the line time.

    python -m tests.bench.bench_controller [--count N]

The line-time bound is bytes x 10 / baud: the time the bytes of the exchange take on a
real serial line (8N1: 10 bits a byte), which no driver can beat. A pty has no baud rate
and moves bytes at once, so over a bare pty the ratio measured / bound shows how little
of the line time the software takes. With --emulate (the default shows both), the fake
device holds each reply back for the line time of the request and the reply, as a real
line would, and the ratio shows the overhead on top of the line.

Two operations are timed:
- "write + read-back": SET SP, then GET SP;
- "write_setpoint()": the driver's whole call, which first reads the set point (GET SP)
  so that it writes only on change, then SET SP and GET SP.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from agent.controller.fake_device import FakeDevice
from agent.controller.serial_driver import SerialController

BAUD_RATES = (9600, 115200)


@dataclass
class Figure:
    baud: int
    line: str
    operation: str
    count: int
    median_s: float
    p95_s: float
    bytes_per_op: float

    @property
    def bound_s(self) -> float:
        return self.bytes_per_op * 10 / self.baud

    @property
    def ratio(self) -> float:
        return self.median_s / self.bound_s


async def measure(
    driver: SerialController, operation: Callable[[float], Awaitable[object]], count: int
) -> tuple[list[float], float]:
    """Per-call times and bytes on the line per call, alternating two set points."""
    await operation(21.0)  # warm up
    sent, received = driver.stats.bytes_sent, driver.stats.bytes_received
    times: list[float] = []
    for index in range(count):
        value = 21.5 if index % 2 == 0 else 21.0  # always a change, so always a write
        started = time.perf_counter()
        await operation(value)
        times.append(time.perf_counter() - started)
    total = driver.stats.bytes_sent - sent + driver.stats.bytes_received - received
    return times, total / count


async def run_one(baud: int, emulate: bool, count: int, directory: Path) -> list[Figure]:
    link = directory / f"tty-{baud}-{int(emulate)}"
    figures: list[Figure] = []
    async with FakeDevice(emulate_baud=baud if emulate else None) as device:
        await device.start(pty_link=link)
        async with SerialController(str(link), baudrate=baud, min_write_interval_s=0) as driver:

            async def write_and_read_back(value: float) -> object:
                # The two exchanges of a write, without the driver's read-before-write.
                await driver._call(driver._io_write_setpoint, value)
                return await driver.read_setpoint()

            for name, operation in (
                ("write + read-back", write_and_read_back),
                ("write_setpoint()", driver.write_setpoint),
            ):
                times, per_op = await measure(driver, operation, count)
                figures.append(
                    Figure(
                        baud=baud,
                        line="emulated line" if emulate else "bare pty",
                        operation=name,
                        count=count,
                        median_s=statistics.median(times),
                        p95_s=statistics.quantiles(times, n=20)[-1],
                        bytes_per_op=per_op,
                    )
                )
    return figures


async def main(count: int) -> list[Figure]:
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as directory:
        for emulate in (False, True):
            for baud in BAUD_RATES:
                figures += await run_one(baud, emulate, count, Path(directory))
    return figures


def print_table(figures: list[Figure]) -> None:
    header = (
        f"{'baud':>6}  {'line':<13}  {'operation':<17}  {'n':>4}  {'median ms':>9}  "
        f"{'p95 ms':>7}  {'bytes':>5}  {'bound ms':>8}  {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for f in figures:
        print(
            f"{f.baud:>6}  {f.line:<13}  {f.operation:<17}  {f.count:>4}  "
            f"{f.median_s * 1e3:>9.2f}  {f.p95_s * 1e3:>7.2f}  {f.bytes_per_op:>5.0f}  "
            f"{f.bound_s * 1e3:>8.2f}  {f.ratio:>6.3f}"
        )
    print("\nbound = bytes x 10 / baud; ratio = median / bound")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100, help="operations per figure")
    arguments = parser.parse_args()
    print_table(asyncio.run(main(arguments.count)))
