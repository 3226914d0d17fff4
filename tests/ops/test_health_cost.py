"""The health pass does no work for a device that shows the same as when it was last said:
no status document built, nothing published; a device that changed is said as before."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from agent.config import AgentSettings
from agent.pair.leadership import Role
from agent.runtime.health import DeviceView, Health, InstanceView
from agent.runtime.telemetry import Snapshot


class FakeSession:
    connected = True

    def __init__(self) -> None:
        self.published: list[str] = []

    async def publish(self, topic: str, payload: bytes, **options: Any) -> None:
        self.published.append(topic)


def snapshot(device: str, setpoint: float) -> Snapshot:
    return Snapshot(
        device=device,
        line="floor3",
        instance="a",
        role="active",
        setpoint=setpoint,
        temperature=19.5,
        output=0,
        mode="heat",
        controller="ok",
        fencing_token=None,
        last_sync_time=None,
        last_sync_version=None,
        errors={},
    )


async def test_an_unchanged_device_costs_the_health_pass_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = AgentSettings(
        line_id="floor3", devices="t01@1,t02@2", instance_id="a", serial={"url": "socket://x:1"}
    )
    devices = {name: DeviceView(snapshot(name, 20.0), True, 20.0, None) for name in ("t01", "t02")}

    def view() -> InstanceView:
        return InstanceView(Role.ACTIVE, False, True, True, True, None, dict(devices))

    session = FakeSession()
    health = Health(settings, view, lambda: session, lambda words: None)  # type: ignore[arg-type,return-value]
    built: list[str] = []
    document = Health.device_document

    def counted(self: Health, view: InstanceView, device: str) -> Any:
        built.append(device)
        return document(self, view, device)

    monkeypatch.setattr(Health, "device_document", counted)
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])  # no sleeps: the pass is awaited

    await health.publish_due()
    assert sorted(built) == ["t01", "t02"]
    statuses = [t for t in session.published if t.endswith("/status") and "t0" in t]
    assert len(statuses) == 2

    built.clear()
    session.published.clear()
    clock[0] += 1.5
    await health.publish_due()
    assert built == []  # the same views: no document built
    assert not any("t0" in t for t in session.published)

    # t02's unit changed (a panel change): only its document is built, and said.
    devices["t02"] = dataclasses.replace(devices["t02"], snapshot=snapshot("t02", 23.0))
    clock[0] += 1.5
    await health.publish_due()
    assert built == ["t02"]
    assert [t for t in session.published if "t0" in t] == [
        settings.health.device_status_topic("t02", settings.line.id)
    ]

    # Every interval, all of it again (the heartbeat).
    built.clear()
    clock[0] += settings.health.interval_s
    await health.publish_due()
    assert sorted(built) == ["t01", "t02"]
