"""The Modbus RTU driver against the simulator's Modbus thermostat on a pty (no mocks)."""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.controller.driver import Unit
from agent.controller.interface import (
    ControllerError,
    ControllerUnavailable,
    InvalidSetpoint,
    Limits,
    Mode,
)
from agent.controller.modbus_driver import (
    READ_INPUT,
    WRITE_MULTIPLE,
    ModbusDriver,
    RegisterMap,
    plan_reads,
)
from agent.line.bus import DeviceHandle
from agent.simulator.modbus import FakeModbusThermostat
from tests.support.controllers import FAST_BUS, one_controller

# A thermostat with everything: input registers for the readings, limits in registers,
# unsigned hundredths, write-multiple, an unusual unit id.
FULL_MAP = RegisterMap(
    unit_id=17,
    setpoint_register=100,
    temperature_register=200,
    output_register=201,
    mode_register=202,
    limits=None,
    min_register=110,
    max_register=111,
    step_register=112,
    scale=100,
    signed=False,
    status_function=READ_INPUT,
    write_function=WRITE_MULTIPLE,
)
SIMPLE_MAP = RegisterMap()  # set point 0, temperature 1, tenths, signed, fixed limits


# --- the register map ------------------------------------------------------------------


def test_register_codec() -> None:
    signed = RegisterMap(scale=10, signed=True)
    assert signed.encode(21.5) == 215
    assert signed.encode(-5.5) == 0x10000 - 55
    assert signed.decode(0x10000 - 55) == -5.5
    unsigned = RegisterMap(scale=100, signed=False)
    assert unsigned.encode(21.55) == 2155
    assert unsigned.decode(65535) == 655.35
    with pytest.raises(InvalidSetpoint):
        unsigned.encode(-1)
    with pytest.raises(InvalidSetpoint):
        signed.encode(4000)


@given(st.integers(0, 0xFFFF), st.booleans(), st.sampled_from([1, 2, 10, 100]))
def test_decode_then_encode_is_the_identity(raw: int, signed: bool, scale: int) -> None:
    register_map = RegisterMap(signed=signed, scale=scale)
    assert register_map.encode(register_map.decode(raw)) == raw


@pytest.mark.parametrize(
    "kwargs",
    [
        {"unit_id": 0},
        {"unit_id": 248},
        {"setpoint_register": -1},
        {"temperature_register": 70000},
        {"scale": 0},
        {"read_function": 6},
        {"status_function": 1},
        {"write_function": 3},
        {"limits": None},
        {"min_register": 5},
        {"limits": None, "min_register": 5, "max_register": 6},
    ],
)
def test_register_map_refuses_nonsense(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RegisterMap(**kwargs)  # type: ignore[arg-type]


def test_plan_reads_joins_close_registers() -> None:
    assert plan_reads([(3, 0), (4, 1), (3, 1)]) == [(3, 0, 2), (4, 1, 1)]
    assert plan_reads([(4, 200), (4, 202), (4, 201), (3, 100)]) == [(3, 100, 1), (4, 200, 3)]
    assert plan_reads([(3, 0), (3, 40)]) == [(3, 0, 1), (3, 40, 1)]


def test_defaults() -> None:
    driver = ModbusDriver("/dev/ttyUSB0")
    assert driver.timing.bits_per_char == 11  # 8E1
    # Hundreds of milliseconds, from the baud rate: not the seconds of library defaults.
    assert 0.05 <= driver.reply_timeout_s < 0.5
    assert ModbusDriver.register_map(Unit("t", 7)) == RegisterMap(unit_id=7)


def test_the_driver_needs_no_pymodbus() -> None:
    script = (
        "import sys\n"
        "sys.modules['pymodbus'] = None\n"  # makes `import pymodbus` fail
        "import agent.controller, agent.controller.line_driver, agent.simulator.cli\n"
        "import agent.runtime.agent, agent.line.bus\n"
        "from agent.controller.modbus_driver import ModbusDriver\n"
        "print(ModbusDriver('/dev/ttyUSB0').timing.bits_per_char)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.strip() == "11"


# --- against the fake thermostat -------------------------------------------------------

Pair = tuple[FakeModbusThermostat, DeviceHandle]
FAST_REPLY_S = 1.0
"""Short, but longer than the fake (in this process) stalls on a loaded machine."""


def modbus(link: str) -> ModbusDriver:
    # Parity N: Linux ptys may refuse parity bits (the fake uses N too).
    return ModbusDriver(link, parity="N", reply_timeout_s=FAST_REPLY_S)


def on_line(handle: DeviceHandle, call: str) -> object:
    """A driver call of the tests' own (read_setpoint), through the bus's thread."""
    driver = handle.bus.driver
    return handle.bus.call_on_line(lambda: getattr(driver, call)(handle.unit))


@contextlib.asynccontextmanager
async def started(
    tmp_path: Path, register_map: RegisterMap, **fake_options: object
) -> AsyncIterator[Pair]:
    fake = FakeModbusThermostat(register_map, **fake_options)  # type: ignore[arg-type]
    await fake.start(tmp_path / "ttyMODBUS")
    assert fake.link is not None
    unit = Unit("t1", register_map.unit_id, register_map)
    try:
        async with one_controller(modbus(fake.link), unit) as handle:
            yield fake, handle
    finally:
        await fake.stop()


@pytest.fixture(params=[SIMPLE_MAP, FULL_MAP], ids=["simple", "full"])
async def pair(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pair]:
    async with started(tmp_path, request.param, time_constant_s=1e6) as found:
        yield found


async def test_reads(pair: Pair) -> None:
    fake, handle = pair
    register_map = handle.unit.options
    assert handle.available
    assert await handle.read_limits() == Limits(5.0, 35.0, 0.5)
    assert await on_line(handle, "read_setpoint") == 20.0
    state = await handle.read_state()
    assert (state.setpoint, state.temperature) == (20.0, 18.0)
    if register_map.mode_register is None:
        assert (state.output, state.mode) == (None, None)
    else:
        assert (state.output, state.mode) == (50, Mode.HEAT)
    used = {a.function_code for a in fake.accesses}
    assert used == ({3} if register_map is SIMPLE_MAP else {3, 4})


async def test_write_rounds_and_reads_back(pair: Pair) -> None:
    fake, handle = pair
    register_map = handle.unit.options
    assert await handle.write_setpoint(22.3) == 22.5
    assert fake.setpoint == 22.5
    assert [w.stored for w in fake.writes] == [22.5]
    writes = [a for a in fake.accesses if a.written is not None]
    assert writes[0].function_code == register_map.write_function
    assert writes[0].written == (register_map.encode(22.5),)
    # Read back after the write: the write's echo is no read-back.
    last = fake.accesses[-1]
    assert last.written is None and last.address == register_map.setpoint_register


async def test_writes_keep_the_least_interval(pair: Pair) -> None:
    fake, handle = pair
    await handle.write_setpoint(21)
    await handle.write_setpoint(22)
    times = [w.at for w in fake.writes]
    assert [w.stored for w in fake.writes] == [21.0, 22.0]
    assert times[1] - times[0] >= FAST_BUS["min_write_interval_s"]


@pytest.mark.parametrize("value", [4.0, 36.0, math.nan, math.inf, "21", None, False])
async def test_invalid_setpoints_write_nothing(pair: Pair, value: object) -> None:
    fake, handle = pair
    with pytest.raises(InvalidSetpoint):
        await handle.write_setpoint(value)
    assert fake.writes == []
    assert all(a.written is None for a in fake.accesses)


async def test_negative_temperatures_need_signed_registers(tmp_path: Path) -> None:
    async with started(tmp_path, SIMPLE_MAP, temperature=-5.5, time_constant_s=1e6) as pair:
        _, handle = pair
        assert (await handle.read_state()).temperature == -5.5


async def test_device_refusal_is_a_controller_error(tmp_path: Path) -> None:
    # The map promises 5..35, the device only takes 5..30: exception 3, illegal value.
    async with started(tmp_path, SIMPLE_MAP, limits=Limits(5.0, 30.0, 0.5)) as (fake, handle):
        with pytest.raises(ControllerError, match="exception 3"):
            await handle.write_setpoint(32)
        assert fake.setpoint == 20.0
        assert await on_line(handle, "read_setpoint") == 20.0


async def test_wrong_register_is_a_controller_error(tmp_path: Path) -> None:
    fake = FakeModbusThermostat(SIMPLE_MAP)
    await fake.start(tmp_path / "ttyMODBUS")
    assert fake.link is not None
    wrong = RegisterMap(temperature_register=50)
    try:
        async with one_controller(modbus(fake.link), Unit("t1", 1, wrong)) as handle:
            with pytest.raises(ControllerError, match="exception 2"):
                await handle.read_state()
            assert handle.available  # it answered
    finally:
        await fake.stop()


async def test_silence_and_bad_crc_are_unavailable_then_recover(pair: Pair) -> None:
    fake, handle = pair
    fake.fault("SILENT", 30)
    started_at = time.monotonic()
    with pytest.raises(ControllerUnavailable):
        await handle.read_state()
    assert time.monotonic() - started_at < FAST_REPLY_S + 1.0
    fake.fault("CLEAR")
    assert (await handle.read_state()).setpoint == 20.0
    assert handle.available
    # A reply with a bad CRC: the unit is there, but said nothing usable.
    fake.fault("GARBAGE", 1)
    with pytest.raises(ControllerError, match="CRC"):
        await handle.read_state()
    assert (await handle.read_state()).setpoint == 20.0


async def test_unplug_and_replug(pair: Pair) -> None:
    fake, handle = pair
    seen: list[bool] = []
    handle.bus.on_availability = lambda name, available: seen.append(available)
    fake.fault("UNPLUG", 0.3)
    with pytest.raises(ControllerUnavailable):
        await handle.read_state()
    assert not handle.available
    with pytest.raises(ControllerUnavailable):
        await handle.write_setpoint(25)
    await fake.wait_for(lambda: fake.plug_count == 1)
    assert await handle.wait_available(5.0)
    assert seen == [False, True]
    assert await handle.write_setpoint(25) == 25.0
    assert [w.stored for w in fake.writes] == [25.0]
