"""The cycle's line time the agent computes at start, logs and warns with: every exchange
that reads each unit once, so a unit with a profile counts its own frames."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from agent.config import AgentSettings
from agent.controller.timing import cycle_s
from agent.runtime.line import line_cycle_s, make_driver, make_units, warn_about


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [n for n in os.environ if n.upper().startswith("AGENT_")]:
        monkeypatch.delenv(name)
    yield


def line(driver: str, units: int, *, profile: str | None = None, **serial: object) -> AgentSettings:
    extra = f', "profile": "{profile}"' if profile else ""
    devices = ",".join(f'{{"id": "t{n:02d}", "address": {n}{extra}}}' for n in range(1, units + 1))
    return AgentSettings(
        line_id="floor3",
        serial={"url": "socket://127.0.0.1:1", "driver": driver, **serial},
        devices=f"[{devices}]",
    )


@pytest.mark.parametrize("driver", ["line", "modbus"])
def test_the_cycle_is_every_unit_read_once(driver: str) -> None:
    settings = line(driver, 8, baudrate=19200)
    driver_ = make_driver(settings)
    plain = cycle_s(driver_.timing, 8, *driver_.poll_frame)
    assert line_cycle_s(driver_, make_units(settings)) == pytest.approx(plain)


@pytest.mark.parametrize("driver", ["line", "modbus"])
def test_units_with_a_profile_count_their_own_frames(driver: str) -> None:
    settings = line(driver, 8, profile="sim", baudrate=19200)
    driver_ = make_driver(settings)
    units = make_units(settings)
    expected = sum(
        driver_.timing.transaction_s(request, reply)
        for unit in units
        for request, reply in driver_.poll_frames(unit)
    )
    assert line_cycle_s(driver_, units) == pytest.approx(expected)
    assert expected > cycle_s(driver_.timing, 8, *driver_.poll_frame)  # every point, not two


def test_the_warning_names_a_cycle_longer_than_the_poll_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 32 Modbus units at 9600 baud: about 0.91 s of line time a cycle; 40: about 1.14 s.
    for units, warned in ((32, False), (40, True)):
        settings = line("modbus", units, baudrate=9600, parity="E", poll_interval_s=1.0)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="agent"):
            cycle = warn_about(settings, make_driver(settings))
        assert cycle == pytest.approx(units * 0.0285, rel=0.01)
        assert any("longer than the poll interval" in r.message for r in caplog.records) is warned
