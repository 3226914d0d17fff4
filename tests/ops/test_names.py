"""Which line or device an operator's name means, pure: checked as the agent checks its ids,
looked up among what the agents reported, with close matches for a typo."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.ops.names import BadName, Reported, Target, UnknownName, check_name, resolve

HEALTH: list[dict[str, Any]] = [
    {"line": "floor3", "instance": "a", "devices": ["floor3-t01", "floor3-t02"]},
    {"line": "floor3", "instance": "b", "devices": ["floor3-t01", "floor3-t02"]},
    {"line": "boiler-1", "instance": "a", "devices": ["boiler-1"]},  # a single device
    {"line": "floor4", "status": "down", "reason": "connection lost"},  # a will: no devices
]
REPORTED = Reported.from_health(HEALTH)


def test_what_the_agents_reported() -> None:
    assert REPORTED.lines == {"floor3", "boiler-1", "floor4"}
    assert REPORTED.devices == {
        "floor3-t01": "floor3",
        "floor3-t02": "floor3",
        "boiler-1": "boiler-1",
    }
    assert resolve("floor3", REPORTED) == Target("floor3", None)
    assert resolve("floor3-t02", REPORTED) == Target("floor3", "floor3-t02")
    assert resolve("boiler-1", REPORTED) == Target("boiler-1", "boiler-1")
    assert resolve("floor4", REPORTED) == Target("floor4", None)


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("floor03", "no agent has reported a line or device named floor03 (did you mean floor3?)"),
        ("FLOOR3", "(did you mean floor3?)"),
        ("floor3-t1", "(did you mean floor3-t01?)"),
        ("floor3-t0", "(did you mean floor3-t01 or floor3-t02?)"),
        ("cellar", "no agent has reported a line or device named cellar"),
    ],
)
def test_a_name_nobody_reported_is_refused_with_close_matches(name: str, said: str) -> None:
    with pytest.raises(UnknownName) as refused:
        resolve(name, REPORTED)
    assert said in str(refused.value)


def test_a_device_command_suggests_devices_only() -> None:
    with pytest.raises(UnknownName, match=r"a device named floor3 \(did you mean floor3-t0"):
        resolve("floor3", REPORTED, devices_only=True)


def test_nothing_reported_says_where_to_look() -> None:
    with pytest.raises(UnknownName, match="is this the broker they use"):
        resolve("floor3", Reported())


@pytest.mark.parametrize("name", ["floor3\\x", "floor 3", "floor3/", "+", "#", "a@1", "", "-x"])
def test_a_name_the_agent_would_refuse_is_bad(name: str) -> None:
    with pytest.raises(BadName, match=r"not a line or device name: .*use letters, digits"):
        check_name(name)


@given(st.lists(st.dictionaries(st.sampled_from(["line", "devices", "x"]), st.from_type(object))))
def test_any_health_document_is_read_or_skipped(documents: list[dict[str, Any]]) -> None:
    reported = Reported.from_health(documents)
    assert all(isinstance(line, str) for line in reported.lines)
