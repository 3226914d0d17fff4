"""The bus and the gate: every transaction asks it right before its first byte, with how
long it may last; what it holds back never reaches the line; a write decided on a reading
goes out only if the unit still holds it. Real bus, real driver, the fake line on TCP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from agent.controller.driver import Unit
from agent.controller.interface import ReadingChanged, WriteNotAllowed
from agent.controller.line_driver import LineDriver
from agent.line.bus import Bus, DeviceHandle
from agent.simulator.device import FakeDevice
from agent.simulator.line import FakeLine
from tests.support.controllers import FAST_BUS

FAST_DRIVER = {"reply_timeout_s": 0.25}


class Lease:
    """A gate as the agent's: open until a deadline, for transactions that end before it."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.asked: list[float] = []
        self.driving = True

    def gate(self, lasts_s: float) -> bool:
        self.asked.append(lasts_s)
        return self.driving and time.monotonic() + lasts_s <= self.deadline


@pytest.fixture
async def device() -> AsyncIterator[FakeDevice]:
    fake = FakeDevice()
    await fake.start(tcp_port=0)
    try:
        yield fake
    finally:
        await fake.stop()


async def bus_with(device: FakeDevice, lease: Lease, **options: object) -> Bus:
    assert device.tcp_url is not None
    bus = Bus(
        LineDriver(device.tcp_url, **FAST_DRIVER),
        [Unit("t1")],
        gate=lease.gate,
        driving=lambda: lease.driving,
        **{**FAST_BUS, "poll_interval_s": 3600.0, **options},  # type: ignore[arg-type]
    )
    await bus.open()
    return bus


async def test_every_transaction_asks_the_gate_with_its_whole_length(device: FakeDevice) -> None:
    lease = Lease(60)
    bus = await bus_with(device, lease)
    try:
        handle = bus.device("t1")
        await handle.read_state()
        await handle.write_setpoint(22.0)
        driver = bus.driver
        # Each asked with the bounded write, the request and the longest reply's line time,
        # and the reply timeout: the whole transaction, not just its request.
        assert lease.asked and all(lasts >= driver.reply_timeout_s for lasts in lease.asked)
        assert bus.withheld == 0
    finally:
        await bus.close()


async def test_a_transaction_the_lease_would_not_cover_never_reaches_the_line(
    device: FakeDevice,
) -> None:
    lease = Lease(60)
    bus = await bus_with(device, lease)
    try:
        handle = bus.device("t1")
        await handle.read_limits()
        before = len(device.records)
        lease.driving = False  # the lease is gone (lost, or paused past its deadline)
        with pytest.raises(WriteNotAllowed):
            await handle.write_setpoint(23.0)
        with pytest.raises(WriteNotAllowed):
            await handle.read_state()
        assert len(device.records) == before
        assert bus.withheld == 2
        assert device.setpoint == 20.0
    finally:
        await bus.close()


async def test_urgent_work_waits_for_a_renewal_while_the_master_still_drives(
    device: FakeDevice,
) -> None:
    """The lease is still held but too short for a whole transaction: the write waits for
    the renewal (the deadline moves on) and then goes out."""
    lease = Lease(60)
    bus = await bus_with(device, lease)
    try:
        handle = bus.device("t1")
        await handle.read_limits()
        lease.deadline = time.monotonic() + 0.1  # less than one transaction's bound
        write = asyncio.ensure_future(handle.write_setpoint(24.0))
        await asyncio.sleep(0.3)
        assert not write.done() and device.setpoint == 20.0
        assert bus.withheld > 0
        lease.deadline = time.monotonic() + 60  # renewed
        assert await asyncio.wait_for(write, 5) == 24.0
    finally:
        await bus.close()


async def test_a_write_goes_out_only_if_the_unit_still_holds_what_it_was_decided_on(
    device: FakeDevice,
) -> None:
    lease = Lease(60)
    bus = await bus_with(device, lease)
    try:
        handle: DeviceHandle = bus.device("t1")
        state = await handle.read_state()
        device.panel_setpoint(18.5)  # a person turns the knob after the reading
        with pytest.raises(ReadingChanged) as refused:
            await handle.write_setpoint(23.0, expected=state.setpoint, fresh_after=time.monotonic())
        assert refused.value.state is not None and refused.value.state.setpoint == 18.5
        assert device.setpoint == 18.5 and device.writes == []
        # Decided on the new reading, it goes out (the reading just taken is fresh).
        assert await handle.write_setpoint(23.0, expected=18.5) == 23.0
    finally:
        await bus.close()


async def test_a_fresh_reading_needs_no_second_read_before_the_write(device: FakeDevice) -> None:
    lease = Lease(60)
    bus = await bus_with(device, lease)
    try:
        handle = bus.device("t1")
        await handle.read_limits()
        asked = time.monotonic()
        state = await handle.read_state()
        before = len(device.records)
        await handle.write_setpoint(22.5, expected=state.setpoint, fresh_after=asked)
        kinds = [r.kind for r in device.records[before:]]
        assert kinds == ["SET SP"]  # no read in between: the reading was the last transaction
    finally:
        await bus.close()


async def test_no_poll_comes_between_a_read_and_the_write_decided_on_it() -> None:
    """With the line busy polling, a write decided on an urgent read (after a store round
    trip, as the sync's) goes out next, on that reading: no poll of another unit makes it
    stale, so the write needs no read of its own."""
    line = FakeLine(units=3, emulate_baud=19200, turnaround_s=0.01)
    await line.start(tcp_port=0)
    assert line.tcp_url is not None
    lease = Lease(60)
    units = [Unit(f"t{n}", n) for n in (1, 2, 3)]
    bus = Bus(
        LineDriver(line.tcp_url, baudrate=19200, **FAST_DRIVER),
        units,
        gate=lease.gate,
        **{**FAST_BUS, "poll_interval_s": 0.001, "min_write_interval_s": 0},  # type: ignore[arg-type]
    )
    await bus.open()
    try:
        handle = bus.device("t1")
        await handle.read_limits()
        for _ in range(3):
            asked = time.monotonic()
            state = await handle.read_state()
            await asyncio.sleep(0.005)  # the pending record's round trip
            before = line.counters.requests
            value = 22.5 if state.setpoint != 22.5 else 23.0
            await handle.write_setpoint(value, expected=state.setpoint, fresh_after=asked)
            kinds = [(r.address, r.kind) for r in line.records_since(before)]
            assert kinds[0] == (1, "SET SP"), kinds
    finally:
        await bus.close()
        await line.stop()
