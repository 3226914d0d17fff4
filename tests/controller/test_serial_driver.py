"""The line-protocol driver against the fake device, over a real pty (and TCP)."""

from __future__ import annotations

import asyncio
import itertools
import math
import select
import time
from decimal import Decimal
from pathlib import Path

import pytest

from agent.controller import base
from agent.controller.fake_device import FakeDevice
from agent.controller.interface import (
    ControllerError,
    ControllerUnavailable,
    DeviceIdentity,
    InvalidSetpoint,
    Limits,
    Mode,
)
from agent.controller.serial_driver import DEFAULT_REPLY_TIMEOUT_S, SerialController
from tests.controller.conftest import FAST


def sent(device: FakeDevice, since: int = 0) -> list[str]:
    """The requests the device received, as text without checksums."""
    return [r.line.decode().split("*")[0] for r in device.requests[since:]]


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


# --- defaults --------------------------------------------------------------------------


def test_defaults() -> None:
    driver = SerialController("socket://127.0.0.1:9")
    assert driver.min_write_interval_s == 1.0
    assert (driver.backoff_initial_s, driver.backoff_max_s) == (1.0, 30.0)
    assert driver.reply_timeout_s == DEFAULT_REPLY_TIMEOUT_S
    assert driver.exclusive is False  # sockets cannot be locked
    assert SerialController("/dev/ttyUSB0").exclusive is True
    assert SerialController("/dev/serial/by-id/usb-FTDI-if00-port0").exclusive is True
    assert not driver.available


def test_backoff_doubles_from_1_to_30_s() -> None:
    delays = base.backoff_delays(base.DEFAULT_BACKOFF_INITIAL_S, base.DEFAULT_BACKOFF_MAX_S)
    assert [next(delays) for _ in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_write_interval_s": -1},
        {"backoff_initial_s": 0},
        {"backoff_initial_s": 5, "backoff_max_s": 1},
        {"reply_timeout_s": 0},
        {"baudrate": -5},
        {"baudrate": 0},
        {"parity": "X"},
    ],
)
def test_bad_settings_are_refused_at_once(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SerialController("socket://127.0.0.1:9", **kwargs)  # type: ignore[arg-type]


def test_unknown_url_scheme_is_refused_at_once() -> None:
    with pytest.raises(ValueError):
        SerialController("carrier-pigeon://loft")


# --- every command ---------------------------------------------------------------------


async def test_every_read(device: FakeDevice, driver: SerialController) -> None:
    assert await driver.identify() == DeviceIdentity("SIM-TSTAT", "1.0.0", "SIM0001")
    assert await driver.read_limits() == Limits(5.0, 35.0, 0.5)
    assert await driver.read_setpoint() == 20.0
    assert await driver.read_temperature() == pytest.approx(device.state().temperature, abs=0.1)
    state = await driver.read_state()
    assert state.setpoint == 20.0
    assert state.mode is Mode.HEAT  # 18 °C toward 20 °C
    assert state.output is not None and 0 < state.output <= 100
    assert driver.last_state == state


async def test_open_reads_limits_and_state(device: FakeDevice, driver: SerialController) -> None:
    assert sent(device)[:2] == ["GET LIMITS", "GET STATE"]
    assert driver.limits == Limits(5.0, 35.0, 0.5)
    assert driver.last_state is not None


async def test_every_request_carries_a_valid_checksum(
    device: FakeDevice, driver: SerialController
) -> None:
    await driver.identify()
    await driver.write_setpoint(23)
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


async def test_write_rounds_writes_and_reads_back(
    device: FakeDevice, driver: SerialController
) -> None:
    before = len(device.requests)
    assert await driver.write_setpoint(22.26) == 22.5
    assert [w.stored for w in device.writes] == [22.5]
    assert device.setpoint == 22.5
    assert sent(device, before) == ["GET SP", "SET SP 22.5", "GET SP"]
    assert driver.last_state is not None and driver.last_state.setpoint == 22.5


async def test_write_only_on_change(device: FakeDevice, driver: SerialController) -> None:
    assert await driver.write_setpoint(20.0) == 20.0  # already 20.0
    assert await driver.write_setpoint(20.2) == 20.0  # rounds to what is there
    assert device.writes == []
    await driver.write_setpoint(21)
    await driver.write_setpoint(21.0)
    assert len(device.writes) == 1


async def test_a_change_at_the_panel_is_seen_before_writing(
    device: FakeDevice, driver: SerialController
) -> None:
    await driver.write_setpoint(25)
    device.panel_setpoint(22)
    # The driver's cached state says 25, the device holds 22: 25 must be written again.
    assert await driver.write_setpoint(25) == 25.0
    assert [w.stored for w in device.writes] == [25.0, 25.0]


async def test_write_interval_is_respected_by_waiting(
    device: FakeDevice, driver: SerialController
) -> None:
    interval = FAST["min_write_interval_s"]
    started = time.monotonic()
    await driver.write_setpoint(21)
    await driver.write_setpoint(22)
    await driver.write_setpoint(23)
    assert time.monotonic() - started >= 2 * interval
    times = [w.at for w in device.writes]
    assert len(times) == 3
    # Measured at the device.
    assert all(later - earlier >= interval for earlier, later in itertools.pairwise(times))


async def test_concurrent_writes_are_serialised_and_spaced(
    device: FakeDevice, driver: SerialController
) -> None:
    results = await asyncio.gather(*(driver.write_setpoint(v) for v in (21, 22, 23)))
    assert results == [21.0, 22.0, 23.0]
    times = [w.at for w in device.writes]
    assert all(b - a >= FAST["min_write_interval_s"] for a, b in itertools.pairwise(times))


async def test_reads_are_not_held_up_by_a_write_waiting_for_its_interval(
    device: FakeDevice,
) -> None:
    assert device.pty_link is not None
    async with SerialController(device.pty_link, **{**FAST, "min_write_interval_s": 2.0}) as driver:
        await driver.write_setpoint(21)
        waiting = asyncio.create_task(driver.write_setpoint(22))
        await device.wait_for(lambda: sent(device)[-1] == "GET SP")
        started = time.monotonic()
        await driver.read_state()
        assert time.monotonic() - started < 1.0
        assert not waiting.done()
        assert await waiting == 22.0


@pytest.mark.parametrize(
    "value",
    [4.5, 35.5, -40, 1000, math.nan, math.inf, -math.inf, Decimal("NaN"), "22", None, True, [22]],
)
async def test_invalid_setpoints_are_rejected_and_nothing_is_written(
    device: FakeDevice, driver: SerialController, value: object
) -> None:
    before = list(device.requests)
    with pytest.raises(InvalidSetpoint):
        await driver.write_setpoint(value)
    assert device.writes == []
    assert not any(r.line.startswith(b"SET") for r in device.requests)
    # Non-numbers are refused before any I/O at all.
    if not isinstance(value, int | float | Decimal) or isinstance(value, bool):
        assert device.requests == before
    assert device.setpoint == 20.0


async def test_refused_by_the_device_when_its_limits_changed(
    device: FakeDevice, driver: SerialController
) -> None:
    device.core.limits = Limits(5.0, 30.0, 0.5)
    with pytest.raises(ControllerError, match=r"ERR RANGE 5\.0 30\.0"):
        await driver.write_setpoint(32)
    assert device.setpoint == 20.0
    # The refusal makes the driver read the limits again before the next write.
    with pytest.raises(InvalidSetpoint):
        await driver.write_setpoint(32)
    assert driver.limits == Limits(5.0, 30.0, 0.5)
    assert [w.stored for w in device.writes] == [None]


# --- wrong checksums, garbage, stray bytes ---------------------------------------------


@pytest.mark.parametrize(("fault", "message"), [("BADSUM", "wrong"), ("NOSUM", "missing")])
async def test_replies_with_a_bad_or_missing_checksum_are_rejected(
    device: FakeDevice, driver: SerialController, fault: str, message: str
) -> None:
    device.fault(fault, 1)
    with pytest.raises(ControllerError, match=f"checksum {message}"):
        await driver.read_state()
    assert driver.available  # it answered: an error, not an absence
    assert (await driver.read_state()).setpoint == 20.0


async def test_garbage_is_an_error_and_the_next_request_works(
    device: FakeDevice, driver: SerialController
) -> None:
    device.fault("GARBAGE", 2)
    with pytest.raises(ControllerError):
        await driver.read_state()
    with pytest.raises(ControllerError):
        await driver.read_setpoint()
    assert await driver.read_setpoint() == 20.0


async def test_garbage_during_a_write_writes_nothing(
    device: FakeDevice, driver: SerialController
) -> None:
    device.fault("GARBAGE", 1)  # hits the GET SP that precedes the write
    with pytest.raises(ControllerError):
        await driver.write_setpoint(24)
    assert device.writes == []
    assert await driver.write_setpoint(24) == 24.0


async def test_stray_bytes_before_a_reply_are_discarded(
    device: FakeDevice, driver: SerialController
) -> None:
    device.fault("STRAY", 3)
    assert await driver.read_setpoint() == 20.0
    assert (await driver.read_limits()).max == 35.0
    assert (await driver.identify()).model == "SIM-TSTAT"
    assert device.faults.stray == 0


async def test_stale_bytes_waiting_in_the_port_are_discarded(
    device: FakeDevice, driver: SerialController
) -> None:
    # A reply nobody asked for, left in the port's input buffer.
    assert device._pty is not None
    import os

    os.write(device._pty.pty.master, b"SP 99.0*3D\r\n\x00\xff")
    # Wait until the kernel has handed it to the driver's side of the pty.
    assert driver._port is not None
    assert select.select([driver._port.fileno()], [], [], 5)[0]
    assert await driver.read_setpoint() == 20.0


# --- silence and slowness --------------------------------------------------------------


async def test_silence_times_out_without_blocking_the_loop(
    device: FakeDevice, driver: SerialController
) -> None:
    seen: list[bool] = []
    driver._on_availability = seen.append
    device.fault("SILENT", 30)
    async with Ticker() as ticker:
        started = time.monotonic()
        with pytest.raises(ControllerUnavailable, match="no reply"):
            await driver.read_state()
        elapsed = time.monotonic() - started
    assert FAST["reply_timeout_s"] <= elapsed < FAST["reply_timeout_s"] + 1.0
    # The worker waited about 0.35 s; the loop never stalled for anything like that.
    assert ticker.longest < 0.2
    assert not driver.available
    assert seen == [False]
    # Nothing is written while it is silent.
    with pytest.raises(ControllerUnavailable):
        await driver.write_setpoint(25)
    device.fault("CLEAR")
    assert (await driver.read_state()).setpoint == 20.0
    assert driver.available
    assert seen == [False, True]
    assert device.writes == []


async def test_slow_reply_within_the_timeout_is_fine(
    device: FakeDevice, driver: SerialController
) -> None:
    device.fault("SLOW", 150)
    started = time.monotonic()
    assert await driver.read_setpoint() == 20.0
    assert time.monotonic() - started >= 0.15


async def test_slow_reply_over_the_timeout_is_unavailable_and_never_mistaken_later(
    device: FakeDevice, driver: SerialController
) -> None:
    device.fault("SLOW", 500)
    with pytest.raises(ControllerUnavailable):
        await driver.read_state()  # its STATE reply arrives late
    device.fault("CLEAR")
    # The late STATE reply must not be taken for the reply to GET SP.
    assert await driver.read_setpoint() == 20.0
    assert await driver.read_state()


# --- unplug and replug -----------------------------------------------------------------


async def test_unplug_and_replug(device: FakeDevice, driver: SerialController) -> None:
    seen: list[bool] = []
    driver._on_availability = seen.append
    await driver.write_setpoint(22)
    device.fault("UNPLUG", 0.5)
    with pytest.raises(ControllerUnavailable):
        await driver.read_state()
    assert not driver.available
    # While it is gone, calls fail at once and nothing is written.
    started = time.monotonic()
    with pytest.raises(ControllerUnavailable):
        await driver.write_setpoint(26)
    with pytest.raises(ControllerUnavailable):
        await driver.read_state()
    assert time.monotonic() - started < 0.1
    # Someone changes the set point at the device meanwhile.
    device.panel_setpoint(24)
    await device.wait_for(lambda: device.plug_count == 1)
    before = len(device.requests)
    assert await driver.wait_available(5.0)
    assert driver.reopen_count == 1
    assert seen == [False, True]
    # The reopen read limits and state before anything else.
    assert sent(device, before)[:2] == ["GET LIMITS", "GET STATE"]
    assert driver.last_state is not None and driver.last_state.setpoint == 24.0
    assert await driver.write_setpoint(26) == 26.0
    assert [w.stored for w in device.writes] == [22.0, 26.0]


async def test_unplugged_while_idle_is_noticed_at_the_next_request(
    device: FakeDevice, driver: SerialController
) -> None:
    device.fault("UNPLUG", 0.2)
    await device.wait_for(lambda: device.unplugged)
    with pytest.raises(ControllerUnavailable):
        await driver.read_setpoint()
    await device.wait_for(lambda: device.plug_count == 1)
    assert await driver.wait_available(5.0)
    assert await driver.read_setpoint() == 20.0


async def test_reopen_retries_with_backoff_until_the_device_returns(
    device: FakeDevice, driver: SerialController, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="agent.controller.base")
    device.fault("UNPLUG", 1.0)
    with pytest.raises(ControllerUnavailable):
        await driver.read_state()
    await device.wait_for(lambda: device.plug_count == 1)
    assert await driver.wait_available(5.0)
    attempts = [r.created for r in caplog.records if "reopen attempt" in r.getMessage()]
    # 0.05, 0.1, 0.2, 0.4, 0.4 ... s apart: a few failures, growing gaps, capped.
    assert 3 <= len(attempts) <= 7
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert all(gap >= 0.09 for gap in gaps)
    assert all(gap <= FAST["backoff_max_s"] + 0.15 for gap in gaps)
    assert any("reopened" in r.getMessage() for r in caplog.records)


async def test_open_without_a_device_does_not_raise_and_connects_later(tmp_path: Path) -> None:
    link = tmp_path / "ttyLATE"
    async with SerialController(str(link), **FAST) as driver:
        assert not driver.available
        with pytest.raises(ControllerUnavailable):
            await driver.read_state()
        async with FakeDevice() as device:
            await device.start(pty_link=link)
            assert await driver.wait_available(5.0)
            assert (await driver.read_state()).setpoint == 20.0


async def test_exclusive_open(device: FakeDevice, driver: SerialController) -> None:
    assert device.pty_link is not None
    async with SerialController(device.pty_link, **FAST) as second:
        assert not second.available  # the first holds the lock
    assert await driver.read_setpoint() == 20.0


async def test_closed_driver_is_unavailable(device: FakeDevice) -> None:
    assert device.pty_link is not None
    driver = SerialController(device.pty_link, **FAST)
    with pytest.raises(ControllerUnavailable):
        await driver.read_state()
    async with driver:
        pass
    with pytest.raises(ControllerUnavailable):
        await driver.read_state()
    with pytest.raises(ControllerUnavailable):
        await driver.write_setpoint(22)


async def test_many_concurrent_requests_one_in_flight(
    device: FakeDevice, driver: SerialController
) -> None:
    calls = [driver.read_setpoint, driver.read_limits, driver.read_state, driver.identify] * 10
    results = await asyncio.gather(*(call() for call in calls))
    assert results[0] == 20.0 and isinstance(results[1], Limits)
    assert [type(r) for r in results] == [type(r) for r in results[:4]] * 10


# --- socket:// -------------------------------------------------------------------------


async def test_socket_url(device: FakeDevice) -> None:
    assert device.tcp_url is not None and device.tcp_url.startswith("socket://")
    async with SerialController(device.tcp_url, **FAST) as driver:
        assert driver.available
        assert await driver.write_setpoint(23.7) == 23.5
        assert device.writes[-1].channel == "tcp"
        device.fault("GARBAGE", 1)
        with pytest.raises(ControllerError):
            await driver.read_state()
        assert (await driver.read_state()).setpoint == 23.5


async def test_two_gateways_share_the_device_server(device: FakeDevice) -> None:
    assert device.tcp_url is not None
    async with (
        SerialController(device.tcp_url, **FAST) as first,
        SerialController(device.tcp_url, **FAST) as second,
    ):

        async def reads(driver: SerialController, n: int) -> list[object]:
            out: list[object] = []
            for _ in range(n):
                out.append(await driver.read_setpoint())
                out.append(await driver.read_limits())
            return out

        a, b = await asyncio.gather(reads(first, 20), reads(second, 20))
        assert a == b == [20.0, Limits(5.0, 35.0, 0.5)] * 20


async def test_socket_unplug_and_replug(device: FakeDevice) -> None:
    assert device.tcp_url is not None
    async with SerialController(device.tcp_url, **FAST) as driver:
        device.fault("UNPLUG", 0.3)
        with pytest.raises(ControllerUnavailable):
            await driver.read_state()
        assert not driver.available
        await device.wait_for(lambda: device.plug_count == 1)
        assert await driver.wait_available(5.0)
        assert await driver.write_setpoint(30) == 30.0
