"""A reply that misses its deadline still comes, later: it must never pass for the reply
to a later request of the same unit, even when the request after the timeout was held
back by the gate (the soak's D6: the wait for quiet was done for a request never sent,
and the next one took the crawling unit's old reply for its own)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agent.controller.driver import Driver, GateClosed, Unit
from agent.controller.interface import ControllerUnavailable
from agent.controller.line_driver import LineDriver
from agent.controller.modbus_driver import ModbusDriver
from agent.simulator.line import FakeLine

REPLY_TIMEOUT_S = 0.2
LATE_BY_MS = 500  # the reply comes after the timeout and after one wait for quiet


@pytest.fixture(params=["line protocol", "modbus"])
async def line(request: pytest.FixtureRequest) -> AsyncIterator[FakeLine]:
    fake = FakeLine(2, modbus=request.param == "modbus", time_constant_s=1e6)
    await fake.start(tcp_port=0)
    try:
        yield fake
    finally:
        await fake.stop()


def driver_for(
    line: FakeLine, baudrate: int = 9600, reply_timeout_s: float = REPLY_TIMEOUT_S
) -> Driver:
    assert line.tcp_url is not None
    if line.register_map is not None:
        return ModbusDriver(
            line.tcp_url, baudrate=baudrate, parity="N", reply_timeout_s=reply_timeout_s
        )
    return LineDriver(line.tcp_url, baudrate=baudrate, reply_timeout_s=reply_timeout_s)


async def test_a_late_reply_is_waited_out_even_after_a_request_the_gate_held_back(
    line: FakeLine,
) -> None:
    driver = driver_for(line)
    unit = Unit("t2", 2)
    line.unit(2).fault("SLOW", LATE_BY_MS)

    def closed(lasts_s: float) -> bool:
        return False

    def session() -> float:
        driver.open()
        try:
            with pytest.raises(ControllerUnavailable):
                driver.read_state(unit)  # its reply, set point 20, is on its way
            line.unit(2).fault("CLEAR")
            line.unit(2).panel_setpoint(25.0)
            with pytest.raises(GateClosed):
                driver.read_state(unit, closed)  # waited for quiet, then held back
            return driver.read_state(unit).setpoint
        finally:
            driver.close()

    assert await asyncio.to_thread(session) == 25.0


async def test_another_units_late_reply_costs_no_wait(line: FakeLine) -> None:
    """Unit 2 answers out of turn, a little past its reply's time, while unit 1 (which
    takes its time) is still to answer: unit 2's reply is told apart by its address,
    discarded, and unit 1's is read; nothing is counted as corrupt (three corrupt replies
    in a row quarantine a healthy unit), and unit 1's own reply is not left on the line
    to pass for the answer to its next request.

    Unit 2's reply comes a third of a reply timeout after its deadline, unit 1's two
    thirds after its request: a timeout long enough that a loaded machine's delays (the
    driver's thread scheduled late takes a late reply already waiting for its own) stay
    inside those margins."""
    timeout_s = 0.9
    driver = driver_for(line, reply_timeout_s=timeout_s)
    reply_wait_ms = driver.reply_wait_s(driver.poll_frame[0]) * 1000
    line.unit(2).fault("LATE", round(reply_wait_ms + timeout_s / 3 * 1000))
    line.unit(1).fault("SLOW", round(2 * timeout_s / 3 * 1000))
    line.unit(1).panel_setpoint(24.0)

    def session() -> list[float]:
        driver.open()
        try:
            with pytest.raises(ControllerUnavailable):
                driver.read_state(Unit("t2", 2))
            first = driver.read_state(Unit("t1", 1)).setpoint
            line.unit(1).fault("CLEAR")
            line.unit(1).panel_setpoint(26.0)
            return [first, driver.read_state(Unit("t1", 1)).setpoint]
        finally:
            driver.close()

    assert await asyncio.to_thread(session) == [24.0, 26.0]
    assert driver.stats.corrupt_replies == 0


async def test_a_reply_from_the_wrong_address_is_no_reply(line: FakeLine) -> None:
    """A unit set to another unit's address: its replies are not taken for its own."""
    driver = driver_for(line)
    line.unit(1).fault("ASADDRESS", 2)

    def session() -> None:
        driver.open()
        try:
            with pytest.raises(ControllerUnavailable):
                driver.read_state(Unit("t1", 1))
        finally:
            driver.close()

    await asyncio.to_thread(session)
    assert driver.stats.corrupt_replies == 0
    assert line.records[-1].answered


async def test_a_reply_later_than_one_quiet_wait_is_waited_out(line: FakeLine) -> None:
    """The p2p soak's lost panel changes: a unit answering 1.2 to 2.5 reply timeouts late;
    the next request, sent after one reply timeout of quiet, took the old reply (set point
    20, read before the panel change) for its own, and a write was decided on it. (At
    115200 baud, where a reply's line time adds little to the timeout.)"""
    driver = driver_for(line, baudrate=115200)
    unit = Unit("t2", 2)
    line.unit(2).fault("SLOW", round(2.4 * REPLY_TIMEOUT_S * 1000))

    def session() -> float:
        driver.open()
        try:
            with pytest.raises(ControllerUnavailable):
                driver.read_state(unit)  # its reply, set point 20, comes 2.4 timeouts late
            line.unit(2).fault("CLEAR")
            line.unit(2).panel_setpoint(25.0)
            return driver.read_state(unit).setpoint
        finally:
            driver.close()

    assert await asyncio.to_thread(session) == 25.0
