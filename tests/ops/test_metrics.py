"""`/metrics` on the health endpoint: a real pair on a fake line, scraped as Prometheus
scrapes it, its text checked by Prometheus's own `promtool`."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.config.health import HealthSettings
from agent.runtime.health_http import HealthEndpoint, UnusableSetting, open_endpoint
from tests.ops.test_health import ENDPOINT, get
from tests.support.rig import STANDBY, LineRig

LINE = LineRig.LINE
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(address: tuple[str, int]) -> tuple[str, Series]:
    code, body = get(address, "/metrics")
    assert code == 200
    text = body.decode()
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series[sample.name, frozenset(sample.labels.items())] = sample.value
    return text, series


def value(series: Series, name: str, **labels: str) -> float | None:
    return series.get((name, frozenset(labels.items())))


def total(series: Series, name: str, **labels: str) -> float:
    """The sum of every series of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in series.items() if n == name and wanted <= ls)


def scrape_until(
    address: tuple[str, int], holds: Callable[[Series], bool], timeout: float = 10
) -> Series:
    deadline = time.monotonic() + timeout
    while True:
        _, series = scrape(address)
        if holds(series):
            return series
        assert time.monotonic() < deadline, "the metrics never showed it"
        time.sleep(0.05)


def address_of(agent: object) -> tuple[str, int]:
    match = agent.wait_for(ENDPOINT)  # type: ignore[attr-defined]
    return match.group(1), int(match.group(2))


def test_the_active_its_line_and_its_devices_show_on_metrics(line: LineRig) -> None:
    active, _ = line.start_active("a", AGENT_HEALTH__PORT="0")
    at_a = address_of(active)
    pair = {"line": LINE, "instance": "a"}

    series = scrape_until(  # every unit read once (a takeover reads them all)
        at_a, lambda s: len([k for k in s if k[0] == "agent_device_temperature_celsius"]) == 4
    )
    assert total(series, "agent_line_transactions_total", result="ok") >= 4
    assert value(series, "agent_active", **pair) == 1
    assert value(series, "agent_standby", **pair) == 0
    assert value(series, "agent_lock_unheld", **pair) == 0
    assert 0 < (value(series, "agent_lease_left_seconds", **pair) or 0) <= line.ttl_ms / 1000
    assert value(series, "agent_role_changes_total", **pair, reason="takeover") == 1
    assert value(series, "agent_store_connected", **pair) == 1
    assert (value(series, "agent_store_last_seen_timestamp_seconds", **pair) or 0) > time.time() - 5
    assert total(series, "agent_store_requests_total", command="SET", result="ok") > 0
    assert value(series, "agent_line_up", **pair) == 1
    assert value(series, "agent_line_port_total", **pair, event="opened") == 1
    for device in line.device_ids:
        assert value(series, "agent_device_up", **pair, device=device) == 1
        assert value(series, "agent_device_temperature_celsius", **pair, device=device) is not None
        room = {**pair, "device": device, "point": "setPoint"}
        assert value(series, "agent_device_setpoint_celsius", **room) == 20.0


@pytest.mark.slow
def test_the_standby_a_refused_value_and_a_dead_unit_show_on_metrics(line: LineRig) -> None:
    active, _ = line.start_active("a", AGENT_HEALTH__PORT="0", AGENT_SERIAL__PROBE_INTERVAL_S="0.3")
    standby = line.start_agent("b", AGENT_HEALTH__PORT="0")
    standby.wait_for_new(STANDBY)
    at_a, at_b = address_of(active), address_of(standby)
    pair = {"line": LINE, "instance": "a"}
    _, of_b = scrape(at_b)
    assert value(of_b, "agent_active", line=LINE, instance="b") == 0
    assert value(of_b, "agent_standby", line=LINE, instance="b") == 1
    assert total(of_b, "agent_line_transactions_total") == 0  # the standby never drives

    # A remote change applied, one the unit cannot take refused, a unit gone silent down.
    assert line.remote_set_device(3, b"24.5") == b"+OK\r\n"
    assert line.remote_set_device(4, b"hot") == b"+OK\r\n"
    line.background.call(lambda: line.unit(2).fault("SILENT", 60))
    t02, t03, t04 = ({**pair, "device": d, "point": "setPoint"} for d in ("t02", "t03", "t04"))
    series = scrape_until(
        at_a,
        lambda s: (
            value(s, "agent_device_up", **pair, device="t02") == 0
            and value(s, "agent_device_setpoint_celsius", **t03) == 24.5
            and (
                value(s, "agent_device_writes_total", **t04, origin="remote", result="refused") or 0
            )
            >= 1
        ),
    )
    assert value(series, "agent_device_writes_total", **t03, origin="remote", result="applied") == 1
    readback = value(
        series, "agent_device_remote_to_readback_seconds_count", **t03, origin="remote"
    )
    assert readback == 1
    assert total(series, "agent_line_transactions_total", unit="t02", result="timeout") > 0
    assert (
        value(series, "agent_device_writes_total", **t02, origin="remote", result="applied") is None
    )


@pytest.mark.slow
def test_promtool_finds_nothing_to_say_about_the_metrics(line: LineRig) -> None:
    promtool = shutil.which("promtool") or pytest.fail("needs promtool (Debian: prometheus)")
    active, _ = line.start_active("a", AGENT_HEALTH__PORT="0")
    at_a = address_of(active)
    scrape_until(at_a, lambda s: total(s, "agent_line_transactions_total") > 0)
    text, _ = scrape(at_a)
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout + checked.stderr


async def test_metrics_can_be_turned_off() -> None:
    endpoint = HealthEndpoint("127.0.0.1", 0, lambda: {"role": "active", "state": "running"})
    address = await endpoint.start()
    try:
        code, _ = await asyncio.to_thread(get, address, "/metrics")
    finally:
        await endpoint.close()
    assert code == 404


async def test_the_default_port_taken_is_said_and_the_agent_runs_without_the_endpoint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def answer() -> dict[str, str]:
        return {"role": "active", "state": "running"}

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # As if it were the default: not set by the operator.
        default = HealthSettings.model_construct(port=port, _fields_set=set())
        assert await open_endpoint(default, answer, bytes) is None
        assert f"default port 127.0.0.1:{port} is taken" in caplog.text
        with pytest.raises(UnusableSetting, match=r"invalid setting AGENT_HEALTH__PORT \(health"):
            await open_endpoint(HealthSettings(port=port), answer, bytes)
