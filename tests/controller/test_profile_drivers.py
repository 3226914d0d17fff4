"""Both drivers keep every point of a unit with a profile, against the fake line on TCP:
one transaction reads them all (the line's records say so), each point is written and read
back, refusals say why, a value the map has no text or register for sends nothing, the gate
is asked before every exchange; a unit without a profile is read as before, byte for byte."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from agent.controller import line_protocol as lp
from agent.controller.driver import Driver, GateClosed, Unit
from agent.controller.interface import (
    DEFAULT_LIMITS,
    ControllerError,
    InvalidSetpoint,
    Limits,
    PointValue,
    SetpointRejected,
)
from agent.controller.line_driver import LineDriver
from agent.controller.line_profile import LinePoint, LineProfile
from agent.controller.modbus_driver import ModbusDriver
from agent.controller.modbus_profile import ModbusPoint, ModbusProfile
from agent.controller.points import InvalidValue
from agent.controller.profile import PointRules, Profile, check
from agent.controller.sim_profile import SIM
from agent.simulator.core import SIM_VALUES
from agent.simulator.line import FakeLine

T = TypeVar("T")
UNITS = 3
REPLY_S = 0.3


@dataclass
class Rig:
    line: FakeLine
    driver: Driver
    modbus: bool

    async def call(self, work: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(work, *args)

    def since(self, seq: int) -> list[Any]:
        return self.line.records_since(seq)

    @property
    def seq(self) -> int:
        return self.line.counters.requests


@contextlib.asynccontextmanager
async def started(modbus: bool, units: int = UNITS, profile: Profile = SIM) -> AsyncIterator[Rig]:
    """A fake line of `units` serving `profile`, on TCP, and a driver connected to it."""
    fake = FakeLine(units, modbus=modbus, time_constant_s=1e6, profile=profile)
    await fake.start(tcp_port=0)
    assert fake.tcp_url is not None
    driver: Driver = (
        ModbusDriver(fake.tcp_url, reply_timeout_s=REPLY_S)
        if modbus
        else LineDriver(fake.tcp_url, reply_timeout_s=REPLY_S)
    )
    await asyncio.to_thread(driver.open)
    try:
        yield Rig(fake, driver, modbus)
    finally:
        await asyncio.to_thread(driver.close)
        await fake.stop()


@pytest.fixture(params=["line", "modbus"])
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    async with started(request.param == "modbus") as found:
        yield found


def unit(address: int = 2, profile: Profile | None = SIM) -> Unit:
    return Unit(f"t{address}", address, profile=profile)


async def test_one_transaction_reads_every_point(rig: Rig) -> None:
    rig.line.unit(2).panel_point("mode", "cool")
    before = rig.seq
    state = await rig.call(rig.driver.read_state, unit())
    (record,) = rig.since(before)
    if rig.modbus:
        assert (record.kind, record.line[2:6]) == ("READ HOLDING", bytes((0, 0, 0, 8)))
    else:
        assert record.line.startswith(b"@2 GET POINTS*")
    assert record.address == 2 and record.answered
    assert (state.setpoint, state.temperature, state.output, state.mode) == (20.0, 18.0, None, None)
    assert dict(state.points) == {"temperature": 18.0, **SIM_VALUES, "mode": "cool"}
    assert state.value("setPoint") == 20.0 and state.value("fan") == "auto"
    assert await rig.call(rig.driver.poll_frames, unit()) == [(8, 21) if rig.modbus else (20, 78)]


async def test_a_unit_without_a_profile_is_read_as_before(rig: Rig) -> None:
    before = rig.seq
    state = await rig.call(rig.driver.read_state, unit(profile=None))
    (record,) = rig.since(before)
    if rig.modbus:
        assert record.line[1:6] == bytes((3, 0, 0, 0, 2))
        assert (state.output, state.mode) == (None, None)
    else:
        assert record.line == lp.encode_line("@2 GET STATE").rstrip(b"\r\n")
        assert state.output is not None
    assert state.points == {}
    assert rig.driver.poll_frames(unit(profile=None)) == [rig.driver.poll_frame]


@pytest.mark.parametrize(
    ("point", "value", "stored"),
    [
        ("setPoint", 22.3, 22.5),
        ("heatSetPoint", 18.2, 18.0),
        ("coolSetPoint", 26.0, 26.0),
        ("mode", "auto", "auto"),
        ("mode", "off", "off"),
        ("fan", "medium", "medium"),
        ("occupied", False, False),
    ],
)
async def test_each_point_is_written_and_read_back(
    rig: Rig, point: str, value: PointValue, stored: PointValue
) -> None:
    before = rig.seq
    assert await rig.call(rig.driver.write_point, unit(), point, value) == stored
    assert rig.line.unit(2).point(point) == stored
    assert rig.line.unit(1).point(point) != stored or (point == "occupied" and stored is True)
    records = rig.since(before)
    if rig.modbus:
        # The write, then its register read back (the echo is no read-back).
        assert [r.kind for r in records] == ["WRITE", "READ HOLDING"]
        assert records[0].point == point
    else:
        # `OK <name> <value>` is the read-back.
        assert [r.kind for r in records] == ["SET SP" if point == "setPoint" else records[0].kind]
        assert records[0].point == point and records[0].kind.startswith("SET ")
    (write,) = rig.line.unit(2).writes
    assert (write.point, write.stored) == (point, stored)


async def test_the_set_point_through_a_profile_is_the_set_point(rig: Rig) -> None:
    assert await rig.call(rig.driver.write_setpoint, unit(), 23.0) == 23.0
    assert rig.line.unit(2).setpoint == 23.0
    assert await rig.call(rig.driver.read_limits, unit()) == DEFAULT_LIMITS


@pytest.mark.parametrize(
    ("point", "value", "line_reason", "modbus_reason"),
    [
        ("heatSetPoint", 30.5, "30.5 is above the limit 30", "does not take heatSetPoint 30.5"),
        ("coolSetPoint", 9.5, "9.5 is below the limit 10", "does not take coolSetPoint 9.5"),
        ("coolSetPoint", 20.5, "at least 1.0 above its heating set point", "against its deadband"),
        ("setPoint", 36.0, "36 is above the limit 35", "exception 3"),
    ],
)
async def test_a_value_the_unit_refuses_says_why(
    rig: Rig, point: str, value: float, line_reason: str, modbus_reason: str
) -> None:
    with pytest.raises(SetpointRejected, match=modbus_reason if rig.modbus else line_reason):
        await rig.call(rig.driver.write_point, unit(), point, value)
    assert rig.line.unit(2).core.values == SIM_VALUES and rig.line.unit(2).setpoint == 20.0


async def test_a_value_the_map_cannot_carry_sends_nothing(rig: Rig) -> None:
    before = rig.seq
    with pytest.raises(InvalidValue):
        await rig.call(rig.driver.write_point, unit(), "mode", "boil")
    with pytest.raises(InvalidValue):
        await rig.call(rig.driver.write_point, unit(), "occupied", "yes")
    with pytest.raises(ControllerError, match="read only"):
        await rig.call(rig.driver.write_point, unit(), "humidity", 50.0)
    with pytest.raises(ControllerError, match="does not say how to write mode"):
        await rig.call(rig.driver.write_point, unit(profile=None), "mode", "heat")
    if rig.modbus:
        with pytest.raises(InvalidSetpoint):
            await rig.call(rig.driver.write_setpoint, unit(), 4000.0)
    assert rig.since(before) == []


async def test_the_gate_is_asked_before_every_exchange(rig: Rig) -> None:
    asked: list[float] = []

    def gate(lasts_s: float) -> bool:
        asked.append(lasts_s)
        return True

    # Asked twice an exchange: at the gate, and once more right before the first byte.
    await rig.call(rig.driver.write_point, unit(), "fan", "low", gate)
    assert len(asked) == 2 * (2 if rig.modbus else 1)
    assert all(0 < lasts <= rig.driver.longest_transaction_s for lasts in asked)
    asked.clear()
    await rig.call(rig.driver.read_state, unit(), gate)
    assert len(asked) == 2
    before = rig.seq
    with pytest.raises(GateClosed):
        await rig.call(rig.driver.write_point, unit(), "fan", "high", lambda lasts_s: False)
    assert rig.since(before) == [] and rig.line.unit(2).point("fan") == "low"
    # The lease ended between the gate and the first byte (a pause there): nothing sent.
    answers = iter([True, False])
    with pytest.raises(GateClosed):
        await rig.call(rig.driver.write_point, unit(), "fan", "high", lambda lasts_s: next(answers))
    assert rig.since(before) == [] and rig.line.unit(2).point("fan") == "low"


async def test_a_panel_change_shows_in_the_next_reading(rig: Rig) -> None:
    fake = rig.line.unit(3)
    fake.panel_point("heatSetPoint", 17.5)
    fake.panel_point("occupied", False)
    fake.panel_value("humidity", "55")
    state = await rig.call(rig.driver.read_state, unit(3))
    assert (state.value("heatSetPoint"), state.value("occupied"), state.value("humidity")) == (
        17.5,
        False,
        55.0,
    )


# --- a profile of its own ------------------------------------------------------------------

# Input registers for the readings, apart from the others; mode written with 16 only, an
# unsigned heating set point in hundredths, an occupancy switch the other way round.
OWN = Profile(
    "own",
    {
        "setPoint": PointRules(DEFAULT_LIMITS),
        "temperature": PointRules(),
        "heatSetPoint": PointRules(Limits(10.0, 25.0, 0.5)),
        "mode": PointRules(),
        "occupied": PointRules(),
        "humidity": PointRules(store_deadband=2.0),
    },
    modbus=ModbusProfile(
        {
            "setPoint": ModbusPoint(0),
            "temperature": ModbusPoint(1, read_function=4, write_function=None),
            "heatSetPoint": ModbusPoint(30, scale=100, signed=False, write_function=16),
            "mode": ModbusPoint(31, write_function=16, values={"off": 10, "heat": 11, "cool": 12}),
            "occupied": ModbusPoint(32, values={True: 0, False: 1}),
            "humidity": ModbusPoint(7, read_function=4, write_function=None),
        }
    ),
    line=LineProfile(
        {
            "setPoint": LinePoint("SP"),
            "temperature": LinePoint("T"),
            "heatSetPoint": LinePoint("HS"),
            "mode": LinePoint("MO", {"heat": "WARM"}),
            "occupied": LinePoint("OC"),
            "humidity": LinePoint("H"),
        }
    ),
)
check(OWN)


@pytest.fixture(params=["line", "modbus"])
async def own(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    async with started(request.param == "modbus", 2, OWN) as found:
        yield found


async def test_a_profile_of_its_own(own: Rig) -> None:
    target = unit(1, OWN)
    before = own.seq
    state = await own.call(own.driver.read_state, target)
    reads = own.since(before)
    if own.modbus:
        # Consecutive registers of one function in one read: holding 0 and 30..32, input 1
        # and 7 (a read across registers the unit lacks would be refused).
        assert [(r.kind, r.line[2:6]) for r in reads] == [
            ("READ HOLDING", bytes((0, 0, 0, 1))),
            ("READ HOLDING", bytes((0, 30, 0, 3))),
            ("READ INPUT", bytes((0, 1, 0, 1))),
            ("READ INPUT", bytes((0, 7, 0, 1))),
        ]
    else:
        assert len(reads) == 1
    assert dict(state.points) == {
        "temperature": 18.0,
        "heatSetPoint": 20.0,
        "mode": "heat",
        "occupied": True,
        "humidity": 45.0,
    }
    assert await own.call(own.driver.write_point, target, "mode", "cool") == "cool"
    assert await own.call(own.driver.write_point, target, "heatSetPoint", 12.25) == 12.5
    assert await own.call(own.driver.write_point, target, "occupied", False) is False
    if own.modbus:
        writes = [r for r in own.since(before) if r.kind.startswith("WRITE")]
        assert [(r.kind, r.point) for r in writes] == [
            ("WRITE MULTIPLE", "mode"),
            ("WRITE MULTIPLE", "heatSetPoint"),
            ("WRITE", "occupied"),
        ]
        assert writes[2].line[4:6] == b"\x00\x01"  # not occupied: 1 in this map
    else:
        assert [r.kind for r in own.since(before)][1:] == ["SET MO", "SET HS", "SET OC"]
    assert own.line.unit(1).core.values["mode"] == "cool"
    if own.modbus:
        with pytest.raises(InvalidValue):
            await own.call(own.driver.write_point, target, "mode", "fan")  # the map has none
    else:
        assert await own.call(own.driver.write_point, target, "mode", "fan") == "fan"
    with pytest.raises(ControllerError, match="does not say how to write fan"):
        await own.call(own.driver.write_point, target, "fan", "low")


async def test_a_read_across_registers_the_unit_lacks_is_refused_by_it() -> None:
    assert OWN.modbus is not None
    gaps = dataclasses.replace(OWN, modbus=dataclasses.replace(OWN.modbus, max_gap=5))
    assert gaps.modbus is not None
    assert gaps.modbus.reads() == [(3, 0, 1), (3, 30, 3), (4, 1, 7)]
    async with started(True, 1, OWN) as own:
        with pytest.raises(ControllerError, match="exception 2"):
            await own.call(own.driver.read_state, unit(1, gaps))
