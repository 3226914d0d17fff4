"""The bus with the line-protocol driver against the fake device, over a real pty (and TCP):
one point-to-point controller, as most of the line's behaviour shows with one unit."""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import select
import time
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agent.controller.driver import Unit
from agent.controller.interface import (
    ControllerError,
    ControllerState,
    ControllerUnavailable,
    DeviceIdentity,
    InvalidSetpoint,
    Limits,
    Mode,
    WriteNotAllowed,
)
from agent.controller.line_driver import LineDriver
from agent.line.bus import Bus, DeviceHandle, backoff_delays
from agent.simulator.device import FakeDevice

T = TypeVar("T")

# Small bounds so that the suite stays fast; the defaults are tested on their own.
FAST_DRIVER: dict[str, Any] = {"reply_timeout_s": 0.25}
FAST_BUS: dict[str, Any] = {
    "poll_interval_s": 3600.0,  # no routine polls unless a test wants them
    "min_write_interval_s": 0.2,
    "backoff_initial_s": 0.05,
    "backoff_max_s": 0.4,
}


def sent(device: FakeDevice, since: int = 0) -> list[str]:
    """The requests the device received, as text without checksums."""
    return [r.line.decode().split("*")[0] for r in device.requests[since:]]


def open_bus(url: str, *, units: list[Unit] | None = None, **options: Any) -> Bus:
    return Bus(
        LineDriver(url, **FAST_DRIVER),
        units or [Unit("t1")],
        **{**FAST_BUS, **options},
    )


async def on_line(handle: DeviceHandle, call: Callable[[LineDriver], T]) -> T:
    """A driver call of the tests' own (identify, read_setpoint) through the bus's thread."""
    driver = handle.bus.driver
    assert isinstance(driver, LineDriver)
    result: T = await handle.bus.call_on_line(lambda: call(driver))
    return result


class Ticker:
    """Measures the longest gap between ticks of a task: the loop's responsiveness."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


@pytest.fixture
async def handle(device: FakeDevice) -> AsyncIterator[DeviceHandle]:
    """One controller on the fake device's pty, through the bus."""
    assert device.pty_link is not None
    async with open_bus(device.pty_link) as bus:
        assert bus.line_up
        yield bus.device("t1")


# --- defaults --------------------------------------------------------------------------


def test_defaults_follow_the_baud_rate() -> None:
    driver = LineDriver("socket://127.0.0.1:9")
    # The device answers within 200 ms; the longest reply at 9600 baud takes 83 ms.
    assert driver.reply_timeout_s == pytest.approx(2 * (0.2 + 80 * 10 / 9600))
    assert LineDriver("socket://127.0.0.1:9", baudrate=115200).reply_timeout_s < 0.5
    assert driver.exclusive is False  # sockets cannot be locked
    assert LineDriver("/dev/ttyUSB0").exclusive is True
    assert LineDriver("/dev/serial/by-id/usb-FTDI-if00-port0").exclusive is True
    bus = Bus(driver, [Unit("t1")])
    assert (bus.backoff_initial_s, bus.backoff_max_s) == (1.0, 30.0)
    assert not bus.line_up


def test_backoff_doubles_from_1_to_30_s() -> None:
    delays = backoff_delays(1.0, 30.0)
    assert [next(delays) for _ in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]


@pytest.mark.parametrize(
    "kwargs",
    [{"reply_timeout_s": 0}, {"baudrate": -5}, {"baudrate": 0}, {"parity": "X"}],
)
def test_bad_settings_are_refused_at_once(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LineDriver("socket://127.0.0.1:9", **kwargs)  # type: ignore[arg-type]


def test_unknown_url_scheme_is_refused_at_once() -> None:
    with pytest.raises(ValueError):
        LineDriver("carrier-pigeon://loft")


@pytest.mark.parametrize(
    "kwargs",
    [{"backoff_initial_s": 0}, {"backoff_initial_s": 5, "backoff_max_s": 1}],
)
def test_bad_bus_settings_are_refused_at_once(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Bus(LineDriver("socket://127.0.0.1:9"), [Unit("t1")], **kwargs)


# --- every command ---------------------------------------------------------------------


async def test_every_read(device: FakeDevice, handle: DeviceHandle) -> None:
    identity = await on_line(handle, lambda d: d.identify(handle.unit))
    assert identity == DeviceIdentity("SIM-TSTAT", "1.0.0", "SIM0001")
    assert await handle.read_limits() == Limits(5.0, 35.0, 0.5)
    assert await on_line(handle, lambda d: d.read_setpoint(handle.unit)) == 20.0
    state = await handle.read_state()
    assert state.setpoint == 20.0
    assert state.temperature == pytest.approx(device.state().temperature, abs=0.1)
    assert state.mode is Mode.HEAT  # 18 °C toward 20 °C
    assert state.output is not None and 0 < state.output <= 100
    assert handle.last_state == state
    assert handle.limits == Limits(5.0, 35.0, 0.5)


async def test_every_request_carries_a_valid_checksum(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    await handle.read_state()
    await handle.write_setpoint(23)
    assert device.requests
    for record in device.requests:
        payload, star, given = record.line.partition(b"*")
        assert star, record.line
        assert int(given, 16) == _xor(payload)


def _xor(data: bytes) -> int:
    result = 0
    for byte in data:
        result ^= byte
    return result


# --- writing ---------------------------------------------------------------------------


async def test_write_rounds_writes_and_reads_back(device: FakeDevice, handle: DeviceHandle) -> None:
    await handle.read_state()
    before = len(device.requests)
    assert await handle.write_setpoint(22.26) == 22.5
    assert [w.stored for w in device.writes] == [22.5]
    assert device.setpoint == 22.5
    # The limits are read once; `OK SP 22.5` is the value as stored: its read-back.
    assert sent(device, before) == ["GET LIMITS", "SET SP 22.5"]
    assert handle.last_state is not None and handle.last_state.setpoint == 22.5


async def test_write_interval_is_respected_by_waiting(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    interval = FAST_BUS["min_write_interval_s"]
    started = time.monotonic()
    await handle.write_setpoint(21)
    await handle.write_setpoint(22)
    await handle.write_setpoint(23)
    assert time.monotonic() - started >= 2 * interval
    times = [w.at for w in device.writes]
    assert len(times) == 3
    # Measured at the device.
    assert all(later - earlier >= interval for earlier, later in itertools.pairwise(times))


async def test_concurrent_writes_to_one_unit_collapse_to_the_latest(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    await handle.write_setpoint(20.5)
    results = await asyncio.gather(
        *(handle.write_setpoint(v) for v in (21, 22, 23)), return_exceptions=True
    )
    assert results[-1] == 23.0
    assert all(isinstance(r, ControllerError) for r in results[:-1]), results
    assert [w.stored for w in device.writes] == [20.5, 23.0]


async def test_reads_are_not_held_up_by_a_write_waiting_for_its_interval(
    device: FakeDevice,
) -> None:
    assert device.pty_link is not None
    async with open_bus(device.pty_link, min_write_interval_s=2.0) as bus:
        handle = bus.device("t1")
        await handle.write_setpoint(21)
        waiting = asyncio.create_task(handle.write_setpoint(22))
        await asyncio.sleep(0)
        started = time.monotonic()
        await handle.read_state()
        assert time.monotonic() - started < 1.0
        assert not waiting.done()
        assert await waiting == 22.0


async def test_allowed_is_asked_after_the_write_interval(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    """A lease holder whose lease ran out while the write waited must not write."""
    await handle.write_setpoint(21.0)
    asked_at: list[float] = []

    def allowed() -> bool:
        asked_at.append(time.monotonic())
        return False

    started = time.monotonic()
    with pytest.raises(WriteNotAllowed):
        await handle.write_setpoint(22.0, allowed=allowed)
    assert asked_at and asked_at[0] - started >= FAST_BUS["min_write_interval_s"] * 0.9
    assert [w.value for w in device.writes] == [21.0]
    assert await handle.write_setpoint(22.0, allowed=lambda: True) == 22.0


@pytest.mark.parametrize(
    "value",
    [4.5, 35.5, -40, 1000, math.nan, math.inf, -math.inf, Decimal("NaN"), "22", None, True, [22]],
)
async def test_invalid_setpoints_are_rejected_and_nothing_is_written(
    device: FakeDevice, handle: DeviceHandle, value: object
) -> None:
    await handle.read_limits()
    before = list(device.requests)
    with pytest.raises(InvalidSetpoint):
        await handle.write_setpoint(value)
    assert device.writes == []
    assert device.requests == before  # refused before any I/O at all
    assert device.setpoint == 20.0


async def test_refused_by_the_device_when_its_limits_changed(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    await handle.read_limits()
    device.core.limits = Limits(5.0, 30.0, 0.5)
    with pytest.raises(ControllerError, match=r"ERR RANGE 5\.0 30\.0"):
        await handle.write_setpoint(32)
    assert device.setpoint == 20.0
    # The refusal makes the limits be read again before the next write.
    with pytest.raises(InvalidSetpoint):
        await handle.write_setpoint(32)
    assert handle.limits == Limits(5.0, 30.0, 0.5)
    assert [w.stored for w in device.writes] == [None]


# --- wrong checksums, garbage, stray bytes ---------------------------------------------


@pytest.mark.parametrize(("fault", "message"), [("BADSUM", "wrong"), ("NOSUM", "missing")])
async def test_replies_with_a_bad_or_missing_checksum_are_rejected(
    device: FakeDevice, handle: DeviceHandle, fault: str, message: str
) -> None:
    device.fault(fault, 1)
    with pytest.raises(ControllerError, match=f"checksum {message}"):
        await handle.read_state()
    assert handle.available  # it answered: an error, not an absence
    assert (await handle.read_state()).setpoint == 20.0
    assert handle.bus.driver.stats.corrupt_replies == 1


async def test_garbage_is_an_error_and_the_next_request_works(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    device.fault("GARBAGE", 2)
    with pytest.raises(ControllerError):
        await handle.read_state()
    with pytest.raises(ControllerError):
        await handle.read_limits()
    assert (await handle.read_state()).setpoint == 20.0


async def test_garbage_during_a_write_is_an_error(device: FakeDevice, handle: DeviceHandle) -> None:
    await handle.read_limits()
    device.fault("GARBAGE", 1)  # hits the write's reply
    with pytest.raises(ControllerError):
        await handle.write_setpoint(24)
    assert await handle.write_setpoint(24) == 24.0


async def test_stray_bytes_before_a_reply_are_discarded(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    device.fault("STRAY", 3)
    assert (await handle.read_state()).setpoint == 20.0
    assert (await handle.read_limits()).max == 35.0
    assert (await on_line(handle, lambda d: d.identify(handle.unit))).model == "SIM-TSTAT"
    assert device.faults.stray == 0


async def test_stale_bytes_waiting_in_the_port_are_discarded(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    # A reply nobody asked for, left in the port's input buffer.
    assert device._pty is not None
    os.write(device._pty.pty.master, b"SP 99.0*3D\r\n\x00\xff")
    # Wait until the kernel has handed it to the driver's side of the pty.
    driver = handle.bus.driver
    assert isinstance(driver, LineDriver)
    fd = driver.fileno()
    assert fd is not None and select.select([fd], [], [], 5)[0]
    assert await on_line(handle, lambda d: d.read_setpoint(handle.unit)) == 20.0


# --- silence and slowness --------------------------------------------------------------


async def test_silence_times_out_without_blocking_the_loop(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    seen: list[bool] = []
    handle.bus.on_availability = lambda name, available: seen.append(available)
    device.fault("SILENT", 30)
    async with Ticker() as ticker:
        started = time.monotonic()
        with pytest.raises(ControllerUnavailable, match="no reply"):
            await handle.read_state()
        elapsed = time.monotonic() - started
    timeout = FAST_DRIVER["reply_timeout_s"]
    assert timeout <= elapsed < timeout + 1.0
    # The worker waited about the reply timeout; the loop never stalled for that long.
    assert ticker.longest < 0.2
    # One timeout is no verdict yet (a frame can be lost); the second quarantines it.
    assert handle.available and seen == []
    with pytest.raises(ControllerUnavailable):
        await handle.read_state()
    assert not handle.available and seen == [False]
    # Quarantined: work for it is refused at once (nothing goes on the line for it: no
    # transaction, so no reply timeout spent), and nothing is written.
    sent = handle.bus.driver.stats.bytes_sent
    started = time.monotonic()
    with pytest.raises(ControllerUnavailable, match="quarantined"):
        await handle.write_setpoint(25)
    assert handle.bus.driver.stats.bytes_sent == sent
    assert time.monotonic() - started < timeout
    assert device.writes == []
    assert handle.bus.driver.stats.timeouts == 2


async def test_a_quarantined_unit_is_probed_and_rejoins(device: FakeDevice) -> None:
    assert device.pty_link is not None
    seen: list[bool] = []
    async with open_bus(
        device.pty_link,
        quarantine_after=1,
        probe_initial_s=0.2,
        probe_max_s=0.4,
        on_availability=lambda name, available: seen.append(available),
    ) as bus:
        handle = bus.device("t1")
        device.fault("SILENT", 60)  # until cleared: however late the read goes out
        with pytest.raises(ControllerUnavailable):
            await handle.read_state()
        assert seen == [False]
        device.fault("CLEAR")
        assert await handle.wait_available(5.0)
        assert seen == [False, True]
        assert (await handle.read_state()).setpoint == 20.0


async def test_slow_reply_within_the_timeout_is_fine(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    device.fault("SLOW", 150)
    started = time.monotonic()
    assert (await handle.read_state()).setpoint == 20.0
    assert time.monotonic() - started >= 0.15


async def test_slow_reply_over_the_timeout_is_unavailable_and_never_mistaken_later(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    device.fault("SLOW", 500)
    with pytest.raises(ControllerUnavailable):
        await handle.read_state()  # its STATE reply arrives late
    device.fault("CLEAR")
    # The late STATE reply must not be taken for the reply to GET SP.
    assert await on_line(handle, lambda d: d.read_setpoint(handle.unit)) == 20.0
    assert await handle.read_state()


# --- unplug and replug -----------------------------------------------------------------


async def test_unplug_and_replug(device: FakeDevice, handle: DeviceHandle) -> None:
    seen: list[bool] = []
    handle.bus.on_availability = lambda name, available: seen.append(available)
    await handle.write_setpoint(22)
    device.fault("UNPLUG", 0.5)
    with pytest.raises(ControllerUnavailable):
        await handle.read_state()
    assert not handle.available and not handle.bus.line_up
    # While it is gone, calls fail at once (no reply timeout spent on them) and nothing is
    # written.
    started = time.monotonic()
    with pytest.raises(ControllerUnavailable):
        await handle.write_setpoint(26)
    with pytest.raises(ControllerUnavailable):
        await handle.read_state()
    assert time.monotonic() - started < FAST_DRIVER["reply_timeout_s"]
    await device.wait_for(lambda: device.plug_count == 1)
    assert await handle.wait_available(5.0)
    assert handle.bus.reopen_count == 1
    assert seen == [False, True]
    assert await handle.write_setpoint(26) == 26.0
    assert [w.stored for w in device.writes] == [22.0, 26.0]


async def test_unplugged_while_idle_is_noticed_at_the_next_request(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    device.fault("UNPLUG", 0.2)
    await device.wait_for(lambda: device.unplugged)
    with pytest.raises(ControllerUnavailable):
        await handle.read_state()
    await device.wait_for(lambda: device.plug_count == 1)
    assert await handle.wait_available(5.0)
    assert (await handle.read_state()).setpoint == 20.0


async def test_reopen_retries_with_backoff_until_the_device_returns(
    device: FakeDevice, handle: DeviceHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="agent.line.bus")
    device.fault("UNPLUG", 1.0)
    with pytest.raises(ControllerUnavailable):
        await handle.read_state()
    await device.wait_for(lambda: device.plug_count == 1)
    assert await handle.wait_available(5.0)
    attempts = [r.created for r in caplog.records if "reopen attempt" in r.getMessage()]
    # 0.05, 0.1, 0.2, 0.4, 0.4 ... s apart: a few failures, growing gaps, capped.
    assert 3 <= len(attempts) <= 7
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert all(gap >= 0.09 for gap in gaps)
    assert all(gap <= FAST_BUS["backoff_max_s"] + 0.15 for gap in gaps)
    assert any("reopened" in r.getMessage() for r in caplog.records)


async def test_open_without_a_device_does_not_raise_and_connects_later(tmp_path: Path) -> None:
    link = tmp_path / "ttyLATE"
    async with open_bus(str(link)) as bus:
        handle = bus.device("t1")
        assert not handle.available
        with pytest.raises(ControllerUnavailable):
            await handle.read_state()
        async with FakeDevice() as device:
            await device.start(pty_link=link)
            assert await handle.wait_available(5.0)
            assert (await handle.read_state()).setpoint == 20.0


async def test_exclusive_open(device: FakeDevice, handle: DeviceHandle) -> None:
    assert device.pty_link is not None
    async with open_bus(device.pty_link) as second:
        assert not second.line_up  # the first holds the lock
    assert (await handle.read_state()).setpoint == 20.0


async def test_closed_bus_is_unavailable(device: FakeDevice) -> None:
    assert device.pty_link is not None
    bus = open_bus(device.pty_link)
    handle = bus.device("t1")
    with pytest.raises(ControllerUnavailable):
        await handle.read_state()
    async with bus:
        pass
    with pytest.raises(ControllerUnavailable):
        await handle.read_state()
    with pytest.raises(ControllerUnavailable):
        await handle.write_setpoint(22)


async def test_many_concurrent_requests_one_in_flight(
    device: FakeDevice, handle: DeviceHandle
) -> None:
    calls = [handle.read_limits, handle.read_state] * 20
    results = await asyncio.gather(*(call() for call in calls))
    assert [type(r) for r in results] == [Limits, ControllerState] * 20
    starts = [r.at for r in device.requests]
    assert starts == sorted(starts)


async def test_routine_polls_go_to_the_reading_handler(device: FakeDevice) -> None:
    assert device.pty_link is not None
    readings: list[tuple[str, ControllerState]] = []
    got = asyncio.Event()

    def on_reading(name: str, state: ControllerState, at: float) -> None:
        readings.append((name, state))
        if len(readings) >= 3:
            got.set()

    async with open_bus(device.pty_link, poll_interval_s=0.05, on_reading=on_reading):
        await asyncio.wait_for(got.wait(), 5)
    assert all(name == "t1" and state.setpoint == 20.0 for name, state in readings)


async def test_a_reading_filter_that_fails_is_not_the_end_of_the_bus(device: FakeDevice) -> None:
    assert device.pty_link is not None
    got = asyncio.Event()

    def wanted(name: str, state: ControllerState) -> bool:
        raise KeyError(name)  # as for a device a reload took off the line, once

    async with open_bus(
        device.pty_link,
        poll_interval_s=0.05,
        reading_wanted=wanted,
        on_reading=lambda name, state, at: got.set(),
    ) as bus:
        await asyncio.wait_for(got.wait(), 5)
        assert (await bus.device("t1").read_state()).setpoint == 20.0


async def test_a_bus_that_stops_on_a_fault_of_its_own_says_so(device: FakeDevice) -> None:
    assert device.pty_link is not None
    stopped = asyncio.Event()
    bus = open_bus(device.pty_link, on_stopped=stopped.set)

    def broken(now: float) -> float:
        raise RuntimeError("a bug in the schedule")

    bus.schedule.next = broken  # type: ignore[method-assign]
    async with bus:
        await asyncio.wait_for(stopped.wait(), 5)


# --- socket:// -------------------------------------------------------------------------


async def test_socket_url(device: FakeDevice) -> None:
    assert device.tcp_url is not None and device.tcp_url.startswith("socket://")
    async with open_bus(device.tcp_url) as bus:
        handle = bus.device("t1")
        assert handle.available
        assert await handle.write_setpoint(23.7) == 23.5
        assert device.writes[-1].channel == "tcp"
        device.fault("GARBAGE", 1)
        with pytest.raises(ControllerError):
            await handle.read_state()
        assert (await handle.read_state()).setpoint == 23.5


async def test_two_gateways_share_the_device_server(device: FakeDevice) -> None:
    assert device.tcp_url is not None
    async with open_bus(device.tcp_url) as first, open_bus(device.tcp_url) as second:

        async def reads(handle: DeviceHandle, n: int) -> list[object]:
            out: list[object] = []
            for _ in range(n):
                out.append((await handle.read_state()).setpoint)
                out.append(await handle.read_limits())
            return out

        a, b = await asyncio.gather(reads(first.device("t1"), 20), reads(second.device("t1"), 20))
        assert a == b == [20.0, Limits(5.0, 35.0, 0.5)] * 20


async def test_socket_unplug_and_replug(device: FakeDevice) -> None:
    assert device.tcp_url is not None
    async with open_bus(device.tcp_url) as bus:
        handle = bus.device("t1")
        device.fault("UNPLUG", 0.3)
        await device.wait_for(lambda: device._tcp is None)  # its connections are closed
        with pytest.raises(ControllerUnavailable):
            await handle.read_state()
        assert not handle.available
        await device.wait_for(lambda: device.plug_count == 1)
        assert await handle.wait_available(5.0)
        assert await handle.write_setpoint(30) == 30.0
