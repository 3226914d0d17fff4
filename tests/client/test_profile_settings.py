"""Profiles in the settings: in the devices file or a file of their own, the built-in `sim`
resolved by the line's driver, each device's profile where the runtime finds it, and every
kind of nonsense refused at start naming the profile and the point."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.config import AgentSettings, setting_errors
from agent.controller.interface import DEFAULT_LIMITS, Limits
from agent.controller.modbus_profile import ModbusPoint
from agent.controller.sim_profile import SIM

LINE = {"line_id": "floor3", "serial": {"url": "socket://127.0.0.1:9"}}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.upper().startswith("AGENT_"):
            monkeypatch.delenv(name)
    yield


def settings(driver: str = "line", **values: Any) -> AgentSettings:
    return AgentSettings(**{**LINE, "serial": {**LINE["serial"], "driver": driver}, **values})


def errors(driver: str = "line", **values: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        settings(driver, **values)
    return "\n".join(setting_errors(caught.value))


def devices_file(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(data))
    return path


def kc(**changes: Any) -> dict[str, Any]:
    """A Modbus thermostat with every point, in consecutive holding registers."""
    points: dict[str, Any] = {
        "setPoint": {"register": 0},
        "temperature": {"register": 1},
        "heatSetPoint": {"register": 2, "limits": {"min": 5, "max": 30, "step": 0.5}},
        "coolSetPoint": {"register": 3, "limits": {"min": 10, "max": 35, "step": 0.5}},
        "mode": {"register": 4, "write": 16, "values": {"off": 0, "heat": 1, "cool": 2}},
        "fan": {"register": 5, "values": {"auto": 0, "low": 1, "high": 2}},
        "occupied": {"register": 6, "values": {"true": 0, "false": 1}},
        "humidity": {"register": 7, "scale": 1, "signed": False, "store_deadband": 5},
    }
    for name, spec in changes.items():
        if spec is None:
            points.pop(name)
        else:
            points[name] = spec
    return {"protocol": "modbus", "deadband": 2.0, "points": points}


LINE_PROFILE = {
    "protocol": "line",
    "points": {
        "setPoint": {"name": "SP"},
        "temperature": {"name": "T"},
        "mode": {"name": "M", "tokens": {"fan": "VENT"}},
    },
}


# --- the built-in sim ---------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["line", "modbus"])
def test_sim_is_built_in_and_speaks_the_lines_protocol(driver: str) -> None:
    found = settings(
        driver,
        devices='[{"id": "t01", "address": 1, "profile": "sim"}, {"id": "t02", "address": 2}]',
    )
    assert found.line.profile("t01") is SIM
    assert found.line.profile("t02") is None
    t01, t02 = found.line.devices
    assert t01.resolved_profile is SIM and t02.resolved_profile is None
    assert found.profile_for(t01) is SIM and found.profile_for("t02") is None
    assert (SIM.modbus if driver == "modbus" else SIM.line) is not None


def test_a_single_device_has_no_profile() -> None:
    found = AgentSettings(device_id="t1", serial={"url": "socket://h:1"})
    assert found.line.profile("t1") is None


def test_a_single_device_with_a_profile_is_listed_alone_on_a_line_of_its_name() -> None:
    alone = AgentSettings(
        line_id="t1", devices='[{"id": "t1", "profile": "sim"}]', serial={"url": "socket://h:1"}
    )
    assert alone.line.single and alone.line.profile("t1") is SIM
    assert alone.lock_key == AgentSettings(device_id="t1", serial={"url": "h"}).lock_key
    # Anything else listed is a line of devices, said as such.
    for line_id, device in (("floor3", '{"id": "t1"}'), ("t1", '{"id": "t1", "address": 1}')):
        listed = AgentSettings(
            line_id=line_id, devices=f"[{device}]", serial={"url": "socket://h:1"}
        )
        assert not listed.line.single, (line_id, device)


# --- profiles in files ----------------------------------------------------------------------


def test_profiles_in_the_devices_file(tmp_path: Path) -> None:
    path = devices_file(
        tmp_path,
        {
            "profiles": {"kc": kc()},
            "devices": [
                {"id": "t01", "address": 1, "profile": "kc"},
                {"id": "t02", "address": 2, "profile": "sim"},
                {"id": "t03", "address": 3},
            ],
        },
    )
    found = settings("modbus", devices_file=path)
    profile = found.line.profile("t01")
    assert profile is not None and profile.name == "kc"
    assert profile.deadband == 2.0
    assert profile.limits("setPoint") == DEFAULT_LIMITS
    assert profile.limits("heatSetPoint") == Limits(5.0, 30.0, 0.5)
    assert profile.points["humidity"].store_deadband == 5.0
    assert profile.after_absence is None  # the line's AGENT_SERIAL__AFTER_ABSENCE
    data = json.loads(path.read_text())
    data["profiles"]["kc"]["after_absence"] = "unit"
    path.write_text(json.dumps(data))
    chosen = settings("modbus", devices_file=path).line.profile("t01")
    assert chosen is not None and chosen.after_absence == "unit"
    assert profile.modbus is not None and profile.line is None
    assert profile.modbus.point("mode") == ModbusPoint(
        4, write_function=16, values={"off": 0, "heat": 1, "cool": 2}
    )
    assert profile.modbus.point("temperature").write_function is None
    assert profile.modbus.point("occupied").values == {True: 0, False: 1}
    assert profile.modbus.point("humidity") == ModbusPoint(
        7, write_function=None, scale=1, signed=False
    )
    assert profile.modbus.reads() == [(3, 0, 8)]
    assert found.line.profile("t02") is SIM and found.line.profile("t03") is None


def test_a_devices_file_may_still_be_a_list(tmp_path: Path) -> None:
    path = devices_file(tmp_path, [{"id": "t01", "address": 1, "profile": "sim"}])
    assert settings(devices_file=path).line.profile("t01") is SIM


def test_profiles_in_a_file_of_their_own(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps({"tiny": LINE_PROFILE}))
    found = settings(
        profiles_file=profiles, devices='[{"id": "t01", "address": 1, "profile": "tiny"}]'
    )
    profile = found.line.profile("t01")
    assert profile is not None and profile.line is not None
    assert profile.line.encode("mode", "fan") == "VENT"
    assert set(profile.points) == {"setPoint", "temperature", "mode"}
    # {"profiles": {...}} is read too, as in a devices file.
    profiles.write_text(json.dumps({"profiles": {"tiny": LINE_PROFILE}}))
    again = settings(
        profiles_file=profiles, devices='[{"id": "t01", "address": 1, "profile": "tiny"}]'
    )
    assert again.line.profile("t01") == profile


def test_a_profile_defined_twice_is_refused(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps({"tiny": LINE_PROFILE}))
    path = devices_file(tmp_path, {"profiles": {"tiny": LINE_PROFILE}, "devices": "t1@1"})
    shown = errors(profiles_file=profiles, devices_file=path)
    assert (
        "AGENT_DEVICES_FILE" in shown
        and "profile tiny: defined in AGENT_PROFILES_FILE too" in shown
    )


# --- nonsense -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "named"),
    [
        (
            kc(mode={"register": 3, "values": {"off": 0}}),
            "profile kc, point mode: holding register 3 is coolSetPoint's",
        ),
        (
            kc(mode={"register": 4, "values": {"off": 0, "heat": 0}}),
            "profile kc, point mode: off and heat both have the register value 0",
        ),
        (
            kc(mode={"register": 4, "values": {"turbo": 5}}),
            "profile kc, point mode: 'turbo' is not one of",
        ),
        (
            kc(occupied={"register": 6, "values": {"yes": 1}}),
            "profile kc, point occupied: values: 'yes' is not true or false",
        ),
        (
            kc(
                heatSetPoint={
                    "register": 2,
                    "write": None,
                    "limits": {"min": 5, "max": 30, "step": 0.5},
                }
            ),
            "profile kc, point heatSetPoint: the agent writes it, but it has no write function",
        ),
        (kc(humidity={"register": 7, "write": 6}), "profile kc, point humidity: it is read only"),
        (
            kc(heatSetPoint={"register": 2}),
            "profile kc, point heatSetPoint: the agent writes it: give its limits",
        ),
        (kc(wind={"register": 9}), "profile kc, point wind: no such point"),
        (kc(mode={"values": {"off": 0}}), "profile kc, point mode: give its register"),
        (
            kc(mode={"register": 4, "name": "M", "values": {"off": 0}}),
            "profile kc, point mode: name is not for a profile of Modbus",
        ),
        (
            kc(mode={"register": 4, "scale": 10, "values": {"off": 0}}),
            "profile kc, point mode: scale and signed are for numbers",
        ),
        (
            kc(
                mode={
                    "register": 4,
                    "limits": {"min": 0, "max": 1, "step": 1},
                    "values": {"off": 0},
                }
            ),
            "profile kc, point mode: only a number has limits",
        ),
        (
            kc(heatSetPoint={"register": 2, "limits": {"min": 30, "max": 5, "step": 0.5}}),
            "profile kc, point heatSetPoint: limits: min 30",
        ),
        (
            kc(mode={"register": 70000, "values": {"off": 0}}),
            "profile kc, point mode: register: Input should be less than",
        ),
        (
            kc(mode={"register": 4, "write": 5, "values": {"off": 0}}),
            "profile kc, point mode: write: Input should be",
        ),
        (
            kc(setPoint={"register": 0, "scale": 1000}),
            "profile kc, point setPoint: its limit 35 does not fit a register",
        ),
        (
            kc(temperature=None),
            "profile kc, point temperature: every profile reads the temperature",
        ),
        (
            {**kc(), "protocol": "bacnet"},
            "profile kc: protocol: Input should be 'modbus' or 'line'",
        ),
        ({**kc(), "colour": "red"}, "profile kc: colour: Extra inputs are not permitted"),
        ({**LINE_PROFILE, "max_gap": 2}, "profile kc: max_gap is for a profile of Modbus"),
        (
            {**kc(), "after_absence": "panel"},
            "profile kc: after_absence: Input should be 'store' or 'unit'",
        ),
        (
            {**LINE_PROFILE, "points": {**LINE_PROFILE["points"], "mode": {"name": "MODE"}}},
            "profile kc, point mode: its name 'MODE'",
        ),
        (
            {
                **LINE_PROFILE,
                "points": {**LINE_PROFILE["points"], "mode": {"name": "M", "register": 4}},
            },
            "profile kc, point mode: register is not for a profile of the line protocol",
        ),
        (
            {**LINE_PROFILE, "points": {**LINE_PROFILE["points"], "mode": {}}},
            "profile kc, point mode: give its name",
        ),
    ],
)
def test_a_profile_that_makes_no_sense_is_refused_naming_the_profile_and_the_point(
    tmp_path: Path, profile: dict[str, Any], named: str
) -> None:
    path = devices_file(tmp_path, {"profiles": {"kc": profile}, "devices": "t1@1"})
    shown = errors("modbus", devices_file=path)
    assert shown.startswith(f"AGENT_DEVICES_FILE ({path}): ")
    assert named in shown


@pytest.mark.parametrize(
    ("driver", "profiles", "device", "named"),
    [
        ("line", {}, {"profile": "kc"}, "device t1: no profile 'kc' (defined: sim)"),
        (
            "line",
            {"kc": kc()},
            {"profile": "kc"},
            "device t1: the profile kc is not for the line protocol, which this line speaks "
            "(AGENT_SERIAL__DRIVER=line)",
        ),
        (
            "modbus",
            {"tiny": LINE_PROFILE},
            {"profile": "tiny"},
            "device t1: the profile tiny is not for Modbus",
        ),
        ("modbus", {"sim": LINE_PROFILE}, {}, "profile sim: the name of a built-in profile"),
        (
            "modbus",
            {},
            {"profile": "sim", "modbus": {"scale": 100}},
            "device t1: give a profile or Modbus overrides, not both",
        ),
    ],
)
def test_a_device_and_its_profile_must_go_together(
    tmp_path: Path, driver: str, profiles: dict[str, Any], device: dict[str, Any], named: str
) -> None:
    path = devices_file(
        tmp_path, {"profiles": profiles, "devices": [{"id": "t1", "address": 1, **device}]}
    )
    assert named in errors(driver, devices_file=path)


def test_a_device_naming_an_unknown_profile_in_agent_devices() -> None:
    shown = errors(devices='[{"id": "t1", "address": 1, "profile": "kc"}]')
    assert shown == "AGENT_DEVICES (devices): device t1: no profile 'kc' (defined: sim)"


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (
            {"devices": "t1@1", "units": 3},
            "'units': a devices file holds devices and profiles only",
        ),
        ({"profiles": {}}, 'no "devices"'),
        ({"profiles": [], "devices": "t1@1"}, "expected an object of profiles by name"),
    ],
)
def test_a_devices_file_that_makes_no_sense(tmp_path: Path, data: object, named: str) -> None:
    assert named in errors(devices_file=devices_file(tmp_path, data))


def test_a_profiles_file_that_is_not_json(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.json"
    profiles.write_text("{")
    shown = errors(profiles_file=profiles, devices="t1@1")
    assert shown.startswith(f"AGENT_PROFILES_FILE ({profiles}): not JSON")
