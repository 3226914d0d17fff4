"""The health document names the package's version on every publish (and the active
publishes on every store notification): it is looked up once, not read from the package's
metadata each time, which took milliseconds on the event loop ahead of the remote change
that woke it."""

from __future__ import annotations

import pytest

from agent.runtime import health


def test_the_version_is_looked_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def version(name: str) -> str:
        calls.append(name)
        return "1.2.3"

    monkeypatch.setattr(health.metadata, "version", version)
    health.version.cache_clear()
    try:
        assert [health.version() for _ in range(3)] == ["1.2.3"] * 3
        assert calls == ["agent"]
    finally:
        health.version.cache_clear()
