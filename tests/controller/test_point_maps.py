"""A profile's protocol maps, pure: the Modbus registers and the line protocol's names of a
thermostat's points, their codecs, the block read, and every kind of nonsense refused with
the point named; the line protocol's GET POINTS and SET <name>; the built-in `sim`."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.controller import line_protocol as lp
from agent.controller.interface import DEFAULT_LIMITS, Limits, PointValue
from agent.controller.line_profile import LinePoint, LineProfile
from agent.controller.modbus_map import RegisterMap
from agent.controller.modbus_profile import MAX_SPAN, ModbusPoint, ModbusProfile, plan_reads
from agent.controller.points import FAN, MODE, InvalidValue
from agent.controller.profile import PointRules, Profile, check
from agent.controller.sim_profile import BUILT_IN, SIM, SIM_LINE, SIM_MODBUS

MODES = {value: raw for raw, value in enumerate(MODE.choices)}


def modbus(**points: ModbusPoint) -> ModbusProfile:
    return ModbusProfile(
        {"setPoint": ModbusPoint(0), "temperature": ModbusPoint(1, write_function=None), **points}
    )


def line(**points: LinePoint) -> LineProfile:
    return LineProfile({"setPoint": LinePoint("SP"), "temperature": LinePoint("T"), **points})


# --- Modbus ---------------------------------------------------------------------------


@given(st.integers(0, 0xFFFF), st.booleans(), st.sampled_from([1, 2, 10, 100, 0.5]))
def test_a_number_register_decodes_and_encodes_back(raw: int, signed: bool, scale: float) -> None:
    points = modbus(heatSetPoint=ModbusPoint(2, scale=scale, signed=signed))
    assert points.encode("heatSetPoint", points.decode("heatSetPoint", raw)) == raw


@given(st.integers(-400, 900).map(lambda n: n / 10))
def test_tenths_round_trip(value: float) -> None:
    points = modbus(heatSetPoint=ModbusPoint(2))
    assert points.decode("heatSetPoint", points.encode("heatSetPoint", value)) == value


def test_numbers_that_do_not_fit_are_refused() -> None:
    points = modbus(humidity=ModbusPoint(7, write_function=None, signed=False))
    assert points.encode("humidity", 45.5) == 455
    with pytest.raises(InvalidValue, match="does not fit"):
        points.encode("humidity", -1.0)
    with pytest.raises(InvalidValue, match="does not fit"):
        points.encode("setPoint", 4000.0)
    with pytest.raises(InvalidValue):
        points.encode("setPoint", "21")  # type: ignore[arg-type]


@given(st.sampled_from(MODE.choices))
def test_a_choice_round_trips_through_its_map(value: str) -> None:
    points = modbus(mode=ModbusPoint(4, values=MODES))
    assert points.decode("mode", points.encode("mode", value)) == value


def test_a_switch_defaults_to_one_and_zero_or_takes_its_map() -> None:
    plain = modbus(occupied=ModbusPoint(6))
    assert (plain.encode("occupied", True), plain.encode("occupied", False)) == (1, 0)
    assert plain.decode("occupied", 1) is True and plain.decode("occupied", 0) is False
    inverted = modbus(occupied=ModbusPoint(6, values={True: 0, False: 0xFF}))
    assert inverted.encode("occupied", True) == 0
    assert inverted.decode("occupied", 0xFF) is False
    with pytest.raises(InvalidValue, match="holds 1"):
        inverted.decode("occupied", 1)
    with pytest.raises(InvalidValue):
        plain.encode("occupied", 1)  # a number is no switch


def test_a_choice_may_map_some_values_only() -> None:
    points = modbus(fan=ModbusPoint(5, values={"auto": 0, "high": 3}))
    assert points.choices("fan") == ("auto", "high")
    with pytest.raises(InvalidValue, match="cannot take fan low"):
        points.encode("fan", "low")
    with pytest.raises(InvalidValue, match="holds 2"):
        points.decode("fan", 2)


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ({"wind": ModbusPoint(3)}, "point wind: no such point"),
        ({"mode": ModbusPoint(4, values={"heat": 1, "cool": 1})}, "point mode: heat and cool both"),
        ({"mode": ModbusPoint(4, values={"turbo": 5})}, "point mode: 'turbo' is not one of"),
        ({"mode": ModbusPoint(4)}, "point mode: give the register value"),
        (
            {"occupied": ModbusPoint(6, values={True: 1})},
            "point occupied: give the register values of both",
        ),
        (
            {"occupied": ModbusPoint(6, values={"yes": 1, False: 0})},
            "point occupied: 'yes' is not true",
        ),
        (
            {"heatSetPoint": ModbusPoint(2, values={"x": 1})},
            "point heatSetPoint: a number has no map",
        ),
        (
            {"heatSetPoint": ModbusPoint(2, write_function=None)},
            "point heatSetPoint: the agent writes it",
        ),
        ({"humidity": ModbusPoint(7)}, "point humidity: it is read only"),
        (
            {"heatSetPoint": ModbusPoint(1)},
            "point heatSetPoint: holding register 1 is temperature's",
        ),
        # A read of input register 0 is no overlap, but its write goes to holding register 0.
        (
            {"heatSetPoint": ModbusPoint(0, read_function=4)},
            "point heatSetPoint: holding register 0",
        ),
    ],
)
def test_a_modbus_map_that_makes_no_sense_names_the_point(
    points: dict[str, ModbusPoint], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        modbus(**points)


def test_a_read_spans_registers_no_point_has_only_where_the_profile_allows() -> None:
    points = modbus(
        heatSetPoint=ModbusPoint(3),
        coolSetPoint=ModbusPoint(4),
        mode=ModbusPoint(9, values=MODES),
        fan=ModbusPoint(17, values={"auto": 0}),
    )
    assert points.reads() == [(3, 0, 2), (3, 3, 2), (3, 9, 1), (3, 17, 1)]
    wide = dataclasses.replace(points, max_gap=4)
    assert wide.reads() == [(3, 0, 10), (3, 17, 1)]
    # However wide the gap, a read spans MAX_SPAN registers at most.
    assert plan_reads([(3, 0), (3, 15)], 15) == [(3, 0, 16)]
    assert plan_reads([(3, 0), (3, 16)], 15) == [(3, 0, 1), (3, 16, 1)]
    with pytest.raises(ValueError, match="max_gap 16"):
        dataclasses.replace(points, max_gap=16)


@given(
    st.sets(st.tuples(st.sampled_from([3, 4]), st.integers(0, 60)), min_size=1), st.integers(0, 15)
)
def test_the_reads_cover_every_register_once_within_the_span(
    wanted: set[tuple[int, int]], max_gap: int
) -> None:
    reads = plan_reads(wanted, max_gap)
    covered = [(function, first + i) for function, first, count in reads for i in range(count)]
    assert len(covered) == len(set(covered))
    assert wanted <= set(covered)
    assert all(count <= MAX_SPAN for _, _, count in reads)
    for function, first, count in reads:
        inside = sorted(r for f, r in wanted if f == function and first <= r < first + count)
        assert inside[0] == first and inside[-1] == first + count - 1
        assert all(b - a - 1 <= max_gap for a, b in itertools.pairwise(inside))


def test_input_and_holding_registers_of_one_number_do_not_overlap() -> None:
    points = modbus(humidity=ModbusPoint(0, read_function=4, write_function=None))
    assert points.reads() == [(3, 0, 2), (4, 0, 1)]


@pytest.mark.parametrize(
    "spec",
    [
        {"register": 70000},
        {"register": 1, "read_function": 6},
        {"register": 1, "write_function": 5},
        {"register": 1, "scale": 0},
        {"register": 1, "values": {"heat": 70000}},
    ],
)
def test_a_point_out_of_range_is_refused(spec: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ModbusPoint(**spec)


def test_the_block_read_joins_close_registers_of_one_function() -> None:
    assert SIM_MODBUS.reads() == [(3, 0, 8)]
    assert SIM_MODBUS.poll_frames() == [(8, 21)]
    far = modbus(
        heatSetPoint=ModbusPoint(40), humidity=ModbusPoint(7, read_function=4, write_function=None)
    )
    assert far.reads() == [(3, 0, 2), (3, 40, 1), (4, 7, 1)]


# --- the line protocol's map -------------------------------------------------------------


@given(
    st.integers(-99, 999).map(lambda n: n / 10),
    st.sampled_from(MODE.choices),
    st.sampled_from(FAN.choices),
    st.booleans(),
)
def test_a_reply_of_every_point_round_trips(
    heat: float, mode: str, fan: str, occupied: bool
) -> None:
    values: dict[str, PointValue] = {
        "setPoint": 21.5,
        "temperature": -3.5,
        "heatSetPoint": heat,
        "coolSetPoint": 24.0,
        "mode": mode,
        "fan": fan,
        "occupied": occupied,
        "humidity": 45.0,
    }
    reply = lp.PointsReply(SIM_LINE.fields(values))
    wire = lp.encode_line(lp.with_address(247, lp.format_reply(reply)))
    assert len(wire) <= SIM_LINE.longest_reply_bytes() <= lp.MAX_LINE
    _, payload = lp.split_address(lp.decode_line(wire, require_checksum=True).payload)
    parsed = lp.parse_reply(payload)
    assert isinstance(parsed, lp.PointsReply)
    assert SIM_LINE.decode_all(parsed.fields) == values


def test_texts_on_the_line() -> None:
    points = line(mode=LinePoint("M", {"fan": "VENT"}), occupied=LinePoint("O"))
    assert points.encode("mode", "heat") == "HEAT"
    assert points.encode("mode", "fan") == "VENT"
    assert points.decode("mode", "vent") == "fan"
    assert points.encode("occupied", True) == "1" and points.decode("occupied", "0") is False
    assert points.encode("setPoint", 21.25) == "21.25"
    with pytest.raises(InvalidValue):
        points.decode("mode", "FAN")  # its token is VENT
    with pytest.raises(InvalidValue):
        points.decode("occupied", "true")
    with pytest.raises(InvalidValue):
        points.encode("mode", "boil")
    with pytest.raises(InvalidValue, match="not a decimal"):
        points.decode("setPoint", "hot")
    assert points.point("M") == "mode" and points.point("X") is None
    assert points.writable_names == {"SP", "M", "O"}


def test_a_reply_without_a_point_of_the_map_is_refused() -> None:
    with pytest.raises(InvalidValue, match="no T"):
        line().decode_all([("SP", "21.5")])
    # Fields the map does not name are ignored.
    assert line().decode_all([("SP", "21.5"), ("T", "19.0"), ("X", "1")]) == {
        "setPoint": 21.5,
        "temperature": 19.0,
    }


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ({"wind": LinePoint("W")}, "point wind: no such point"),
        ({"mode": LinePoint("MOD")}, "point mode: its name 'MOD'"),
        ({"mode": LinePoint("m")}, "point mode: its name 'm'"),
        ({"mode": LinePoint("T")}, "point mode: the name T is temperature's"),
        ({"mode": LinePoint("SP")}, "point mode: the name SP is setPoint's"),
        (
            {"mode": LinePoint("M", {"heat": "HOT", "cool": "HOT"})},
            "point mode: heat and cool both",
        ),
        ({"mode": LinePoint("M", {"boil": "B"})}, "point mode: 'boil' is not one of"),
        ({"mode": LinePoint("M", {"heat": "hot"})}, "point mode: the token 'hot'"),
        ({"mode": LinePoint("M", {"heat": "HEATING"})}, "point mode: the token 'HEATING'"),
        ({"occupied": LinePoint("O", {"true": "YES"})}, "point occupied: only a choice"),
    ],
)
def test_a_line_map_that_makes_no_sense_names_the_point(
    points: dict[str, LinePoint], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        line(**points)


def test_the_set_point_is_sp() -> None:
    with pytest.raises(ValueError, match="point setPoint: its name is SP"):
        LineProfile({"setPoint": LinePoint("S")})
    with pytest.raises(ValueError, match="point mode: SP is the set point's"):
        LineProfile({"mode": LinePoint("SP")})


def test_a_reply_too_long_for_a_line_is_refused() -> None:
    tokens = {value: f"{value.upper()[:3]}XYZ" for value in FAN.choices}
    with pytest.raises(ValueError, match=r"GET POINTS may take 8[0-9] bytes"):
        line(
            heatSetPoint=LinePoint("H1"),
            coolSetPoint=LinePoint("C1"),
            mode=LinePoint("M", {value: f"{value.upper()[:3]}XYZ" for value in MODE.choices}),
            fan=LinePoint("F", tokens),
            occupied=LinePoint("O"),
            humidity=LinePoint("RH"),
        )


# --- the line protocol ------------------------------------------------------------------


def test_get_points_and_set_a_point_format_and_parse() -> None:
    names = SIM_LINE.writable_names
    assert lp.format_request(lp.GetPoints()) == "GET POINTS"
    assert lp.parse_request("get points") == lp.GetPoints()
    assert lp.format_request(lp.SetValue("M", "COOL")) == "SET M COOL"
    assert lp.parse_request("SET M COOL", names) == lp.SetValue("M", "COOL")
    assert lp.parse_request("set m cool", names) == lp.SetValue("M", "COOL")
    assert lp.parse_request("SET SP 21.5", names) == lp.SetSetpoint(21.5)
    for text, code in [
        ("SET M", "SYNTAX"),  # as SET SP
        ("SET M COOL NOW", "SYNTAX"),
        ("SET T 20", "UNKNOWN"),  # read only: not among the names
        ("GET POINTS NOW", "SYNTAX"),
    ]:
        with pytest.raises(lp.RequestError) as caught:
            lp.parse_request(text, names)
        assert caught.value.code == code, text
    # Without names (a unit without a profile), SET of any other name is unknown, as before.
    with pytest.raises(lp.RequestError):
        lp.parse_request("SET M COOL")


def test_points_replies_format_and_parse() -> None:
    reply = lp.PointsReply((("SP", "21.5"), ("M", "HEAT")))
    assert lp.format_reply(reply) == "POINTS SP=21.5 M=HEAT"
    assert lp.parse_reply("POINTS SP=21.5 M=HEAT") == reply
    assert lp.format_reply(lp.ValueStored("H", "20.5")) == "OK H 20.5"
    assert lp.parse_reply("OK H 20.5") == lp.ValueStored("H", "20.5")
    assert lp.parse_reply("OK SP 20.5") == lp.SetpointStored(20.5)
    for text in ["POINTS", "POINTS SP", "POINTS SP=", "POINTS =1", "POINTS SP=1 SP=2"]:
        with pytest.raises(lp.ProtocolError):
            lp.parse_reply(text)


# --- profiles ----------------------------------------------------------------------------

RULES = {"setPoint": PointRules(DEFAULT_LIMITS), "temperature": PointRules()}


def profile(**changes: Any) -> Profile:
    base = Profile("p", RULES, modbus=modbus(), line=line())
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"modbus": None, "line": None}, "profile p: it says how neither"),
        (
            {
                "points": {"setPoint": PointRules(DEFAULT_LIMITS)},
                "line": None,
                "modbus": ModbusProfile({"setPoint": ModbusPoint(0)}),
            },
            "profile p, point temperature: every profile reads",
        ),
        (
            {"points": {**RULES, "mode": PointRules()}},
            "profile p, point mode: the Modbus map does not say how",
        ),
        ({"modbus": None}, None),
        (
            {"modbus": modbus(mode=ModbusPoint(4, values=MODES))},
            "profile p, point mode: in the Modbus map, not a point",
        ),
        (
            {
                "points": {**RULES, "heatSetPoint": PointRules()},
                "modbus": modbus(heatSetPoint=ModbusPoint(2)),
                "line": None,
            },
            "profile p, point heatSetPoint: the agent writes it: give its limits",
        ),
        (
            {
                "points": {**RULES, "mode": PointRules(DEFAULT_LIMITS)},
                "modbus": modbus(mode=ModbusPoint(4, values=MODES)),
                "line": None,
            },
            "profile p, point mode: only a number has limits",
        ),
        (
            {"points": {**RULES, "temperature": PointRules(store_deadband=-1)}},
            "profile p, point temperature: the store deadband",
        ),
        (
            {
                "points": {
                    "setPoint": PointRules(DEFAULT_LIMITS, store_deadband=1.0),
                    "temperature": PointRules(),
                }
            },
            "profile p, point setPoint: a store deadband is for read-only points",
        ),
        ({"deadband": -1.0}, "profile p: the deadband"),
        (
            {
                "points": {
                    "setPoint": PointRules(Limits(-5, 35, 0.5)),
                    "temperature": PointRules(),
                },
                "line": None,
                "modbus": ModbusProfile(
                    {
                        "setPoint": ModbusPoint(0, signed=False),
                        "temperature": ModbusPoint(1, write_function=None),
                    }
                ),
            },
            "profile p, point setPoint: its limit -5 does not fit",
        ),
        (
            {
                "points": {
                    **RULES,
                    "heatSetPoint": PointRules(Limits(20, 30, 0.5)),
                    "coolSetPoint": PointRules(Limits(5, 20.5, 0.5)),
                },
                "modbus": None,
                "line": line(heatSetPoint=LinePoint("H"), coolSetPoint=LinePoint("C")),
            },
            "profile p, point coolSetPoint: its limits leave no cooling set point 1 above",
        ),
    ],
)
def test_a_profile_that_makes_no_sense_names_the_profile_and_the_point(
    changes: dict[str, Any], message: str | None
) -> None:
    bad = profile(**changes)
    if message is None:
        check(bad)  # one protocol is enough
        return
    with pytest.raises(ValueError, match=message):
        check(bad)


def test_the_sim_profile() -> None:
    check(SIM)
    assert BUILT_IN == {"sim": SIM}
    assert set(SIM.points) == set(SIM_MODBUS.points) == set(SIM_LINE.points)
    assert set(SIM.writable) == {
        "setPoint",
        "heatSetPoint",
        "coolSetPoint",
        "mode",
        "fan",
        "occupied",
    }
    # Registers 0 and 1 are the default register map's: a unit without a profile reads as before.
    default = RegisterMap()
    assert SIM_MODBUS.point("setPoint").register == default.setpoint_register
    assert SIM_MODBUS.point("temperature").register == default.temperature_register
    assert SIM_LINE.name("setPoint") == "SP" and SIM_LINE.name("temperature") == "T"
    assert SIM_LINE.poll_frame() == (len(lp.encode_line("@247 GET POINTS")), 78)
