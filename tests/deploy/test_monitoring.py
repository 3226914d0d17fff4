"""deploy/prometheus (alert rules and their tests) and deploy/grafana (the dashboard): every
query names series the agent exposes; Prometheus's `promtool` checks the rules and runs
their tests (slow: it needs Debian's `prometheus` package)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.runtime import metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "agent-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "agent-alerts.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "agent-dashboard.json"
_NAME = re.compile(r"\bagent_[a-z_]+")
_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard_queries() -> list[str]:
    """Every panel's queries, and the template variables' (in their dashboard form)."""
    document = json.loads(DASHBOARD.read_text())
    queries = [
        target["expr"] for panel in document["panels"] for target in panel.get("targets", [])
    ]
    for variable in document["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["query"]["query"])
    return queries


def exposed_names() -> set[str]:
    """The metric families the collector makes (read from its source: its family names are
    literals there)."""
    source = Path(metrics.__file__).read_text()
    return set(re.findall(r'"(agent_[a-z_]+)"', source))


def family(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


@pytest.mark.parametrize("query", [rule["expr"] for rule in alert_rules()] + dashboard_queries())
def test_every_query_names_series_the_agent_exposes(query: str) -> None:
    names = _NAME.findall(query)
    assert names, f"no agent series in {query!r}"
    unknown = {name for name in names if family(name) not in exposed_names()}
    assert not unknown, f"{query!r} names series the agent does not expose: {unknown}"


def test_every_alert_has_a_test_that_fires_it_and_one_that_does_not() -> None:
    cases: dict[str, list[bool]] = {}
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in test["alert_rule_test"]:
            cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    for rule in alert_rules():
        fired = cases.get(rule["alert"], [])
        assert True in fired and False in fired, f"{rule['alert']}: firing and not firing"


def test_every_dashboard_query_is_filtered_by_its_line() -> None:
    panel_queries = [q for q in dashboard_queries() if not q.startswith("label_values(agent_a")]
    for query in panel_queries:
        assert 'line="$line"' in query, query


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("needs promtool (Debian: apt-get install prometheus)")
    return found


@pytest.mark.slow
def test_promtool_checks_the_rules_and_runs_their_tests() -> None:
    for args in (["check", "rules", RULES.name], ["test", "rules", RULE_TESTS.name]):
        done = subprocess.run(
            [promtool(), *args],
            cwd=RULES.parent,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
