"""Debian's Prometheus server scraping a pair on a fake line: its HTTP API answers the
questions operators ask (which instance is active, after a kill the other, a dead unit
down, a refused value counted), and every query of the dashboard returns data."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_monitoring import DASHBOARD
from tests.ops.test_metrics import address_of
from tests.support.ports import free_port
from tests.support.processes import wait_or_kill
from tests.support.rig import ACTIVE, STANDBY, LineRig

LINE = LineRig.LINE
SCRAPE_S = 1
Result = list[dict[str, Any]]


class Prometheus:
    def __init__(self, tmp_path: Path, targets: list[tuple[str, int]]) -> None:
        binary = shutil.which("prometheus") or pytest.fail("needs Debian's prometheus package")
        self.port = free_port()
        config = tmp_path / "prometheus.yml"
        scrape = {
            "job_name": "agent",
            "scrape_interval": f"{SCRAPE_S}s",
            "scrape_timeout": f"{SCRAPE_S}s",
            # The agent's own line and instance labels, not the target's address.
            "honor_labels": True,
            "static_configs": [{"targets": [f"{host}:{port}" for host, port in targets]}],
        }
        config.write_text(json.dumps({"scrape_configs": [scrape]}))  # JSON is YAML
        self.log = (tmp_path / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--query.lookback-delta=3s",  # a killed instance's series gone within seconds
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as answer:
            document = json.load(answer)
        assert document["status"] == "success", document
        return document["data"]

    def query(self, expr: str) -> Result:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        result: Result = data["result"]
        return result

    def until(self, expr: str, holds: Callable[[Result], bool], timeout: float = 30) -> Result:
        deadline = time.monotonic() + timeout
        while True:
            try:
                result = self.query(expr)
            except OSError:  # not listening yet
                result = []
            if holds(result):
                return result
            assert time.monotonic() < deadline, f"{expr}: {result}"
            time.sleep(0.2)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        wait_or_kill(self.proc, 10)
        self.log.close()


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Callable[[list[tuple[str, int]]], Prometheus]]:
    started: list[Prometheus] = []

    def start(targets: list[tuple[str, int]]) -> Prometheus:
        started.append(Prometheus(tmp_path / "prometheus", targets))
        return started[-1]

    (tmp_path / "prometheus").mkdir()
    try:
        yield start
    finally:
        for server in started:
            server.close()


def instances(result: Result) -> list[str]:
    return sorted(series["metric"]["instance"] for series in result)


def dashboard_queries(device: str) -> list[str]:
    document = json.loads(DASHBOARD.read_text())
    return [
        target["expr"].replace("$line", LINE).replace("$device", device)
        for panel in document["panels"]
        for target in panel.get("targets", [])
    ]


@pytest.mark.slow
def test_prometheus_scraping_a_pair_answers_what_operators_ask(
    line: LineRig, prometheus_for: Callable[[list[tuple[str, int]]], Prometheus]
) -> None:
    fast = {"AGENT_HEALTH__PORT": "0", "AGENT_SERIAL__PROBE_INTERVAL_S": "0.3"}
    active, _ = line.start_active("a", **fast)
    standby = line.start_agent("b", **fast)
    standby.wait_for_new(STANDBY)
    prometheus = prometheus_for([address_of(active), address_of(standby)])

    who = f'agent_active{{line="{LINE}"}} == 1'
    assert instances(prometheus.until(who, lambda r: len(r) == 1)) == ["a"]
    # Each target is scraped at its own offset in the interval: b's first scrape may come later.
    standing_by = prometheus.until(f'agent_standby{{line="{LINE}"}} == 1', lambda r: len(r) == 1)
    assert instances(standing_by) == ["b"]

    # The active killed: the other is active, and Prometheus says so.
    active.proc.kill()
    standby.wait_for_new(ACTIVE, timeout=15)
    assert instances(prometheus.until(who, lambda r: instances(r) == ["b"])) == ["b"]
    takeovers = prometheus.query('agent_role_changes_total{instance="b",reason="takeover"}')
    assert [series["value"][1] for series in takeovers] == ["1"]

    # A unit gone silent shows down; a value the unit cannot take counts as refused.
    line.background.call(lambda: line.unit(2).fault("SILENT", 120))
    down = prometheus.until('agent_device_up{instance="b"} == 0', lambda r: len(r) > 0)
    assert [series["metric"]["device"] for series in down] == ["t02"]
    assert line.remote_set_device(4, b"hot") == b"+OK\r\n"
    refused = prometheus.until(
        'agent_device_writes_total{device="t04",origin="remote",result="refused"}',
        lambda r: len(r) == 1,
    )
    assert float(refused[0]["value"][1]) >= 1

    # Every query of the dashboard returns data (its rate() and increase() windows need two
    # scrapes of each series: waited for with the first).
    assert prometheus.api("label/line/values", **{"match[]": "agent_active"}) == [LINE]
    for query in dashboard_queries("t03"):
        assert prometheus.until(query, lambda r: len(r) > 0), query
