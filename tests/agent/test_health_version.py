"""The health document names the package's version on every publish (and the active
publishes on every store notification): it is looked up once, not read from the package's
metadata each time, which took milliseconds on the event loop ahead of the remote change
that woke it; the agent's own process takes it from the command, with no lookup at all."""

from __future__ import annotations

import importlib.metadata

import pytest

from agent.runtime import health, version


def test_the_version_is_looked_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def looked_up(name: str) -> str:
        calls.append(name)
        return "1.2.3"

    monkeypatch.setattr(importlib.metadata, "version", looked_up)
    monkeypatch.setattr(version, "_version", None)
    assert [version.installed() for _ in range(3)] == ["1.2.3"] * 3
    assert calls == ["agent"]


def test_a_version_handed_over_is_the_one_health_names(monkeypatch: pytest.MonkeyPatch) -> None:
    def looked_up(name: str) -> str:
        raise AssertionError("looked up although handed over")

    monkeypatch.setattr(importlib.metadata, "version", looked_up)
    monkeypatch.setattr(version, "_version", None)
    version.handed_over("4.5.6")
    document = health.instance_document(
        status="up", now=0.0, line="l", instance="a", role="standby", state="standby",
        paused=False, ttl_ms=3000, token=None, heartbeat_s=5.0, devices=(), summary="",
    )  # fmt: skip
    assert document["version"] == "4.5.6"
