"""A variable named like a setting but not one is refused with the one most likely meant
(``unknown_variables``); the names the project itself sets or reads stay allowed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.config import AgentSettings, known_variables, unknown_variables
from agent.config.environment import NOT_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
KNOWN = known_variables(AgentSettings)


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("AGENT_MQTT_PORT", "AGENT_MQTT__PORT"),  # one underscore
        ("AGENT_MQTT__PORTT", "AGENT_MQTT__PORT"),
        ("AGENT_SERIAL_URL", "AGENT_SERIAL__URL"),
        ("AGENT_MQTT__TLS__CAFILE", "AGENT_MQTT__TLS__CA_FILE"),
        ("agent_lock__ttl", "AGENT_LOCK__TTL_MS"),
        ("AGENT_LINEID", "AGENT_LINE_ID"),
    ],
)
def test_a_misspelt_variable_is_named_with_the_setting_meant(name: str, meant: str) -> None:
    (line,) = unknown_variables([name, "PATH"], KNOWN)
    assert line.startswith(f"{name}: no such setting")
    assert f"did you mean {meant}?" in line


def test_a_name_like_no_setting_points_at_the_list() -> None:
    (line,) = unknown_variables(["AGENT_ZZZ"], KNOWN)
    assert line == "AGENT_ZZZ: no such setting; agent --help lists the settings"


def test_every_setting_and_section_is_known_in_any_case() -> None:
    names = ["AGENT_MQTT__TLS__KEY_PASSWORD", "AGENT_MQTT", "AGENT_MQTT__TLS", "agent_line_id"]
    assert unknown_variables(names, KNOWN) == []


def _project_names() -> set[str]:
    """Every AGENT_ name the repository's deploy files, unit, docs and tests spell out."""
    found: set[str] = set()
    for folder in ("deploy", "systemd", "docs", "tests", "agent"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in {"", ".py", ".md", ".yml", ".sh", ".example"}:
                text = path.read_text(errors="replace")
                found |= set(re.findall(r"\bAGENT_[A-Z0-9_]*[A-Z0-9]\b", text))
    return found


def test_the_names_the_project_sets_or_reads_stay_allowed() -> None:
    names = _project_names()
    # The names of misspellings the tests themselves make, and placeholders in prose.
    typos = {"AGENT_MQTT__HOTS", "AGENT_MQTT__PORTT", "AGENT_MQTT_PORT", "AGENT_UNRELATED"}
    typos |= {"AGENT_SERIAL_URL", "AGENT_MQTT__TLS__CAFILE", "AGENT_LINEID", "AGENT_ZZZ", "AGENT_X"}
    # Not variables: prefixes in prose (AGENT_MQTT__*), the tests' own constants.
    partial = {n for n in names if n.endswith("_")} | {"AGENT_PREFIX", "AGENT_RELOAD"}
    assert names >= NOT_SETTINGS
    assert unknown_variables(names - typos - partial, KNOWN) == []
