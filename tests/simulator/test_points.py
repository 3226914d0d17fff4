"""Every unit of the fake line is a whole thermostat, as the `sim` profile says: its points
over the line protocol (GET POINTS, SET <name>) and its Modbus registers, the deadband it
keeps, the panel commands that change any point, and the records that say which point."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agent.controller import line_protocol as lp
from agent.controller.interface import DEFAULT_LIMITS, Limits
from agent.controller.line_profile import LinePoint, LineProfile
from agent.controller.modbus_map import RegisterMap
from agent.controller.modbus_profile import ModbusPoint, ModbusProfile
from agent.controller.profile import PointRules, Profile, check
from agent.controller.sim_profile import SIM, SIM_LINE, SIM_MODBUS
from agent.simulator.core import SIM_VALUES, DeviceCore, PanelValue, parse_panel_command
from agent.simulator.line import FakeLine
from agent.simulator.rtu import (
    ILLEGAL_ADDRESS,
    ILLEGAL_FUNCTION,
    ILLEGAL_VALUE,
    RegisterView,
    exception_reply,
    parse_rtu_request,
    with_crc,
)
from agent.simulator.wires import RtuWire, TextWire


def line(payload: str, checksum: bool = True) -> bytes:
    return lp.encode_line(payload, with_checksum=checksum)


def ask(core: DeviceCore, text: str) -> str:
    """A unit's reply to one request on its line, without the checksum."""
    reply = core.respond(line(text, checksum=False), 0.0, "tcp")
    assert reply is not None
    return reply.decode().rstrip("\r\n")


def core(**options: object) -> DeviceCore:
    return DeviceCore(now=0.0, time_constant_s=1e6, **options)  # type: ignore[arg-type]


# --- the line protocol ---------------------------------------------------------------------


def test_get_points_reads_every_point_in_one_line() -> None:
    unit = core()
    assert (
        ask(unit, "GET POINTS") == "POINTS SP=20.0 T=18.0 H=20.0 C=24.0 M=HEAT F=AUTO O=1 RH=45.0"
    )
    # The old requests are as they were.
    assert ask(unit, "GET STATE") == "STATE SP=20.0 T=18.0 OUT=50 MODE=HEAT"


@pytest.mark.parametrize(
    ("request_", "reply", "point", "stored"),
    [
        ("SET H 19.3", "OK H 19.5", "heatSetPoint", 19.5),
        ("SET C 26", "OK C 26.0", "coolSetPoint", 26.0),
        ("SET M COOL", "OK M COOL", "mode", "cool"),
        ("set m auto", "OK M AUTO", "mode", "auto"),
        ("SET F MEDIUM", "OK F MEDIUM", "fan", "medium"),
        ("SET O 0", "OK O 0", "occupied", False),
    ],
)
def test_set_writes_one_point_and_answers_it_as_stored(
    request_: str, reply: str, point: str, stored: object
) -> None:
    unit = core()
    assert ask(unit, request_) == reply
    assert unit.values[point] == stored
    assert [(w.point, w.stored, w.channel) for w in unit.writes] == [(point, stored, "tcp")]


@pytest.mark.parametrize(
    ("request_", "reply"),
    [
        ("SET H 31", "ERR RANGE 5.0 30.0"),
        ("SET C 9.5", "ERR RANGE 10.0 35.0"),
        ("SET H 23.5", "ERR DEADBAND 1.0"),  # the cooling set point is 24.0
        ("SET C 20.5", "ERR DEADBAND 1.0"),  # the heating set point is 20.0
        ("SET M BOIL", "ERR VALUE"),
        ("SET F 2", "ERR VALUE"),
        ("SET O YES", "ERR VALUE"),
        ("SET H warm", "ERR SYNTAX"),
        ("SET T 20", "ERR UNKNOWN"),  # read only
        ("SET RH 20", "ERR UNKNOWN"),
        ("SET X 1", "ERR UNKNOWN"),
    ],
)
def test_a_value_the_unit_cannot_take_is_refused_and_recorded(request_: str, reply: str) -> None:
    unit = core()
    assert ask(unit, request_) == reply
    assert unit.values == SIM_VALUES
    assert all(w.stored is None for w in unit.writes)


def test_the_deadband_holds_both_ways() -> None:
    unit = core()
    assert ask(unit, "SET C 21") == "OK C 21.0"  # 1.0 above 20.0 is enough
    assert ask(unit, "SET H 20.5") == "ERR DEADBAND 1.0"
    assert ask(unit, "SET H 19") == "OK H 19.0"
    assert ask(unit, "SET C 20") == "OK C 20.0"


def test_requests_name_the_point_they_write() -> None:
    wire = TextWire(SIM_LINE)
    heat = wire.parse(line("@2 SET H 19.5"))
    assert heat is not None
    assert (heat.address, heat.kind, heat.value, heat.point) == (2, "SET H", 19.5, "heatSetPoint")
    mode = wire.parse(line("@2 SET M COOL"))
    assert mode is not None and (mode.kind, mode.value, mode.point) == ("SET M", None, "mode")
    setpoint = wire.parse(line("@2 SET SP 21"))
    assert setpoint is not None and (setpoint.kind, setpoint.point) == ("SET SP", "setPoint")
    points = wire.parse(line("@2 GET POINTS"))
    assert points is not None and (points.kind, points.point) == ("GET POINTS", None)


# --- the panel -----------------------------------------------------------------------------


def test_panel_commands_parse() -> None:
    assert parse_panel_command("PANEL H 19.0") == PanelValue("heatSetPoint", "19.0")
    assert parse_panel_command("panel m cool") == PanelValue("mode", "COOL")
    assert parse_panel_command("PANEL RH 60") == PanelValue("humidity", "60")
    for bad in ("PANEL X 1", "PANEL M", "PANEL M COOL NOW"):
        with pytest.raises(lp.RequestError, match="usage: PANEL"):
            parse_panel_command(bad)


@pytest.fixture
async def bus() -> AsyncIterator[FakeLine]:
    fake = FakeLine(3, time_constant_s=1e6)
    await fake.start(tcp_port=0, panel_port=0)
    try:
        yield fake
    finally:
        await fake.stop()


async def panel(bus: FakeLine, text: str) -> str:
    address = bus.panel_address
    assert address is not None
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(text.encode() + b"\n")
        await writer.drain()
        reply = await asyncio.wait_for(reader.readline(), 3.0)
    finally:
        writer.close()
    return reply.decode().rstrip("\r\n")


async def test_panel_commands_change_any_point_and_are_recorded(bus: FakeLine) -> None:
    unit = bus.unit(2)
    assert await panel(bus, "@2 PANEL H 19.0") == "@2 OK H 19.0"
    assert await panel(bus, "@2 PANEL M COOL") == "@2 OK M COOL"
    assert await panel(bus, "@2 PANEL F LOW") == "@2 OK F LOW"
    assert await panel(bus, "@2 PANEL O 0") == "@2 OK O 0"
    assert await panel(bus, "@2 PANEL RH 61.3") == "@2 OK RH 61.3"
    assert await panel(bus, "@2 PANEL T 25.04") == "@2 OK T 25.0"
    assert await panel(bus, "@2 PANEL SP 22") == "@2 OK SP 22.0"
    assert await panel(bus, "@2 PANEL H 30.5") == "@2 ERR RANGE 5.0 30.0"
    assert await panel(bus, "@2 PANEL C 19.5") == "@2 ERR DEADBAND 1.0"
    assert await panel(bus, "@2 PANEL M BOIL") == "@2 ERR VALUE"
    assert await panel(bus, "PANEL M COOL") == "ERR ADDRESS"
    assert (
        await panel(bus, "@2 GET POINTS")
        == "@2 POINTS SP=22.0 T=25.0 H=19.0 C=24.0 M=COOL F=LOW O=0 RH=61.3"
    )
    assert [(c.point, c.value, c.stored) for c in unit.panel_changes] == [
        ("heatSetPoint", 19.0, 19.0),
        ("mode", "cool", "cool"),
        ("fan", "low", "low"),
        ("occupied", False, False),
        ("humidity", 61.3, 61.3),
        ("temperature", 25.04, 25.0),
        ("setPoint", 22.0, 22.0),  # the set point's record, as always
        ("heatSetPoint", 30.5, None),
        ("coolSetPoint", 19.5, None),
    ]  # no mode BOIL: not a value a knob can turn to
    assert all(c.channel == "panel" for c in unit.panel_changes)
    assert unit.writes == [] and bus.records == []
    assert (unit.point("mode"), unit.point("occupied"), unit.point("temperature")) == (
        "cool",
        False,
        25.0,
    )
    assert bus.unit(1).core.values == SIM_VALUES  # one unit's panel only
    unit.panel_point("fan", "high")
    unit.panel_point("setPoint", 23)
    assert (unit.point("fan"), unit.setpoint) == ("high", 23.0)


# --- Modbus registers ------------------------------------------------------------------------


def view(profile: Profile = SIM) -> RegisterView:
    return RegisterView(RegisterMap(), core(profile=profile))


def answer(registers: RegisterView, frame: bytes) -> bytes:
    return registers.answer(parse_rtu_request(frame), 0.0, "tcp")


def read(start: int, count: int, function: int = 3) -> bytes:
    return with_crc(bytes((1, function)) + start.to_bytes(2, "big") + count.to_bytes(2, "big"))


def write(register: int, raw: int, function: int = 6) -> bytes:
    address, value = register.to_bytes(2, "big"), raw.to_bytes(2, "big")
    if function == 6:
        return with_crc(bytes((1, 6)) + address + value)
    return with_crc(bytes((1, 16)) + address + b"\x00\x01\x02" + value)


def test_the_registers_are_the_sim_profiles() -> None:
    registers = view()
    assert registers.registers(0.0) == {0: 200, 1: 180, 2: 200, 3: 240, 4: 1, 5: 0, 6: 1, 7: 450}
    reply = answer(registers, read(0, 8))
    raws = [int.from_bytes(reply[3 + 2 * i : 5 + 2 * i], "big") for i in range(8)]
    held = {
        name: SIM_MODBUS.decode(name, raws[spec.register])
        for name, spec in SIM_MODBUS.points.items()
    }
    assert held == {"setPoint": 20.0, "temperature": 18.0, **SIM_VALUES}


@pytest.mark.parametrize(
    ("frame", "point", "stored"),
    [
        (write(2, 195), "heatSetPoint", 19.5),
        (write(3, 263), "coolSetPoint", 26.5),  # rounded to the step
        (write(4, 2), "mode", "cool"),
        (write(5, 4), "fan", "high"),
        (write(6, 0), "occupied", False),
    ],
)
def test_a_write_of_a_points_register_stores_it(frame: bytes, point: str, stored: object) -> None:
    registers = view()
    assert answer(registers, frame) == frame  # the echo
    assert registers.core.values[point] == stored
    assert [(w.point, w.stored) for w in registers.core.writes] == [(point, stored)]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (write(2, 310), ILLEGAL_VALUE),  # over 30.0
        (write(3, 205), ILLEGAL_VALUE),  # within 1.0 of the heating set point
        (write(4, 9), ILLEGAL_VALUE),  # no mode
        (write(6, 2), ILLEGAL_VALUE),  # neither on nor off
        (write(4, 2, function=16), ILLEGAL_FUNCTION),  # the profile writes mode with 6 only
        (write(7, 500), ILLEGAL_ADDRESS),  # humidity is read only
        (write(1, 100), ILLEGAL_ADDRESS),  # as is the temperature
        (read(0, 9), ILLEGAL_ADDRESS),  # register 8 is not mapped
    ],
)
def test_a_write_the_unit_cannot_take_is_an_exception(frame: bytes, code: int) -> None:
    registers = view()
    assert answer(registers, frame) == exception_reply(1, frame[1], code)
    assert registers.core.values == SIM_VALUES


def test_the_set_point_register_takes_both_write_functions_as_before() -> None:
    registers = view()
    assert answer(registers, write(0, 215, function=16))[1] == 16
    assert registers.core.model.setpoint == 21.5


def test_modbus_requests_name_the_point_they_write() -> None:
    wire = RtuWire(RegisterMap(), SIM_MODBUS)
    for frame, point, value in [
        (write(0, 215), "setPoint", 21.5),
        (write(2, 195), "heatSetPoint", 19.5),
        (write(4, 2), "mode", None),
        (write(1, 100), None, 10.0),  # a write of a read-only register: decoded as before
        (read(0, 8), None, None),
    ]:
        incoming = wire.parse(frame)
        assert incoming is not None and (incoming.point, incoming.value) == (point, value)


# --- a line serving another profile --------------------------------------------------------

OTHER = Profile(
    "other",
    {
        "setPoint": PointRules(DEFAULT_LIMITS),
        "temperature": PointRules(),
        "mode": PointRules(),
        "heatSetPoint": PointRules(Limits(10.0, 25.0, 0.5)),
    },
    modbus=ModbusProfile(
        {
            "setPoint": ModbusPoint(0),
            "temperature": ModbusPoint(1, write_function=None),
            "mode": ModbusPoint(
                20, read_function=4, write_function=16, values={"off": 7, "heat": 8}
            ),
            "heatSetPoint": ModbusPoint(21, scale=100, signed=False, write_function=16),
        }
    ),
    line=LineProfile(
        {
            "setPoint": LinePoint("SP"),
            "temperature": LinePoint("T"),
            "mode": LinePoint("MO", {"heat": "WARM"}),
            "heatSetPoint": LinePoint("HS"),
        }
    ),
)
check(OTHER)


def test_a_unit_serves_exactly_what_its_profile_says() -> None:
    registers = view(OTHER)
    values = registers.registers(0.0)
    assert (values[20], values[21]) == (8, 2000)
    assert 2 not in values  # the sim profile's registers are not this one's
    assert answer(registers, write(20, 7, function=6)) == exception_reply(1, 6, ILLEGAL_FUNCTION)
    assert answer(registers, write(21, 2600, function=16)) == exception_reply(1, 16, ILLEGAL_VALUE)
    assert answer(registers, write(21, 1250, function=16))[1] == 16
    assert registers.core.values["heatSetPoint"] == 12.5
    unit = core(profile=OTHER)
    assert ask(unit, "GET POINTS") == "POINTS SP=20.0 T=18.0 MO=WARM HS=20.0"
    assert ask(unit, "SET MO OFF") == "OK MO OFF"
    assert ask(unit, "SET HS 25.5") == "ERR RANGE 10.0 25.0"
    assert ask(unit, "SET H 19") == "ERR UNKNOWN"  # the sim's name, not this profile's
