"""What a reload changes, decided from the settings alone (agent.runtime.reload)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from agent.config import AgentSettings, as_running
from agent.controller.interface import ControllerState
from agent.runtime import reload
from agent.runtime.driving import ActiveLine

URL = {"url": "socket://127.0.0.1:1"}


def settings(devices: str, **more: object) -> AgentSettings:
    given: dict[str, object] = {"line_id": "floor3", "devices": devices, "serial": URL, **more}
    return AgentSettings(**given)  # type: ignore[arg-type]


def test_added_removed_and_changed_devices() -> None:
    old, new = settings("t01@1,t02@2,t03@3"), settings("t01@1,t03@4,t05@5")
    changes = reload.device_changes(old.line, new.line)
    assert [d.id for d in changes.added] == ["t05"]
    assert changes.removed == ("t02",)
    assert [d.id for d in changes.changed] == ["t03"]
    assert changes.words() == "added t05; removed t02; changed t03"
    assert not reload.device_changes(old.line, settings("t01@1,t02@2,t03@3").line)


def test_a_profile_given_to_a_device_is_a_change() -> None:
    old = settings('[{"id":"t01","address":1}]')
    new = settings('[{"id":"t01","address":1,"profile":"sim"}]')
    assert [d.id for d in reload.device_changes(old.line, new.line).changed] == ["t01"]


def test_another_line_is_refused_and_other_settings_wait_for_a_restart() -> None:
    old = settings("t01@1")
    assert reload.why_not_reloadable(old, settings("t01@1")) is None
    moved = AgentSettings(line_id="floor4", devices="t01@1", serial=URL)  # type: ignore[arg-type]
    assert "AGENT_LINE_ID" in (reload.why_not_reloadable(old, moved) or "")
    slower = settings("t01@1", serial={**URL, "baudrate": 19200})
    assert reload.restart_only(old, slower) == ["AGENT_SERIAL"]
    assert reload.restart_only(old, settings("t01@1,t02@2")) == []
    running = reload.running(old, settings("t01@1,t02@2"))
    assert [d.id for d in running.line.devices] == ["t01", "t02"]
    assert running.serial == as_running(old.serial)


def test_a_line_left_without_devices_is_refused_as_at_start(tmp_path: Path) -> None:
    devices_file = tmp_path / "devices.json"
    devices_file.write_text("[]")
    emptied = AgentSettings(line_id="floor3", devices_file=devices_file, serial=URL)  # type: ignore[arg-type]
    assert emptied.line.devices == ()
    why = reload.why_not_reloadable(settings("t01@1"), emptied)
    assert why is not None and "no device of line floor3 can be served" in why


lines = st.dictionaries(
    st.sampled_from([f"t{n:02d}" for n in range(1, 9)]), st.integers(1, 8), min_size=1
).filter(lambda d: len(set(d.values())) == len(d))


@given(lines, lines)
def test_the_changes_take_the_old_devices_to_the_new(
    old: dict[str, int], new: dict[str, int]
) -> None:
    def line(devices: dict[str, int]) -> AgentSettings:
        return settings(",".join(f"{name}@{address}" for name, address in devices.items()))

    changes = reload.device_changes(line(old).line, line(new).line)
    kept = {name: old[name] for name in old if name not in changes.removed}
    for device in (*changes.changed, *changes.added):
        kept[device.id] = device.address  # type: ignore[assignment]
    assert kept == new
    assert not (set(changes.removed) & {d.id for d in changes.added})


def test_the_bus_finishing_a_removed_devices_transaction_is_no_news() -> None:
    """The bus's thread may finish a transaction of a device a reload has just taken off
    the line: its reading is no news, and nothing fails (the bus once stopped on it)."""
    line = ActiveLine(
        settings("t01@1"),
        driver=None,  # type: ignore[arg-type]
        devices={},
        may_write=lambda: True,
        deadline=lambda: None,
        spawn=asyncio.ensure_future,
    )
    state = ControllerState(21.0, 20.0, None, None)
    assert line._reading_wanted("t02", state) is False
    line._on_reading("t02", state, 0.0)
    line._on_availability("t02", True)
