"""The silent interval before the next frame runs from the end of the last exchange's
reading (the reply's last byte, or its time up), not from the end of the work done on it:
that work is line time the interval covers already (the bus waited a whole interval after
its own decoding, settling and bookkeeping, line time a transaction did not need)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from agent.controller.driver import Driver, Unit
from agent.controller.interface import ControllerUnavailable
from agent.controller.line_driver import LineDriver
from agent.controller.modbus_driver import ModbusDriver
from agent.simulator.line import FakeLine


@pytest.fixture(params=["line protocol", "modbus"])
async def line(request: pytest.FixtureRequest) -> AsyncIterator[FakeLine]:
    fake = FakeLine(2, modbus=request.param == "modbus", time_constant_s=1e6)
    await fake.start(tcp_port=0)
    try:
        yield fake
    finally:
        await fake.stop()


def driver_for(line: FakeLine) -> Driver:
    assert line.tcp_url is not None
    if line.register_map is not None:
        return ModbusDriver(line.tcp_url, baudrate=1200, parity="N", reply_timeout_s=0.3)
    return LineDriver(line.tcp_url, baudrate=1200, reply_timeout_s=0.3)


async def test_the_silent_interval_runs_from_the_end_of_the_reading(line: FakeLine) -> None:
    driver = driver_for(line)  # 1200 Bd: an interval of 29 to 32 ms

    def session() -> tuple[float, float, float, float]:
        driver.open()
        try:
            assert driver.silence_left_s() <= 0  # nothing on the line yet
            driver.read_state(Unit("t1", 1))
            at_once = driver.silence_left_s()
            time.sleep(driver.timing.silent_s / 2)  # work on the reading, say
            after_work = driver.silence_left_s()
            # Nobody answers: its time runs out. The best of three, so that a loaded
            # machine that holds this thread back for an interval's 30 ms fails nothing.
            left = []
            for _ in range(3):
                with pytest.raises(ControllerUnavailable):
                    driver.read_state(Unit("t9", 9))
                left.append(driver.silence_left_s())
            after_timeout = max(left)
            time.sleep(driver.timing.silent_s)
            return at_once, after_work, after_timeout, driver.silence_left_s()
        finally:
            driver.close()

    at_once, after_work, after_timeout, later = await asyncio.to_thread(session)
    silent_s = driver.timing.silent_s
    assert 0 < at_once <= silent_s
    assert after_work <= at_once - silent_s / 2  # the work's time is counted, not added
    assert 0 < after_timeout <= silent_s  # a timeout is the end of a reading too
    assert later <= 0
