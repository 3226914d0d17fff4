"""The health pass does no work for a device that shows the same as when it was last said:
no status document built, nothing published; a device that changed is said as before."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent.config import AgentSettings
from agent.pair.leadership import Role
from agent.protocol.hlc import Hlc
from agent.runtime import agent as agent_module
from agent.runtime import reports
from agent.runtime.agent import Agent
from agent.runtime.health import DeviceView, Health, InstanceView
from agent.runtime.telemetry import Snapshot
from agent.sync.device import DeviceKeys, DeviceSync
from agent.sync.state_file import StateFile


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


class RenewingLeadership:
    """What Agent.view reads of the leadership, its token renewed at will."""

    role = Role.ACTIVE
    losses = 0
    too_slow = None

    def __init__(self) -> None:
        self.token: Hlc | None = Hlc(1_700_000_000_000, 0, "store")
        self.round_trips = SimpleNamespace(worst_s=0.01)

    def renew(self) -> None:
        assert self.token is not None
        self.token = Hlc(self.token.wall_ms + 1000, 0, "store")

    def taking_over_s(self) -> None:
        return None


def test_a_renewal_of_the_lease_rebuilds_no_devices_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal gives the lease a new token every third of a TTL; a device's document does
    not show it. Keyed by it, every device's view (its snapshot, then its document) was
    built again at every renewal: 32 of them a second for a line of 32 at a TTL of 3 s."""
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path))
    settings = AgentSettings(
        line_id="floor3", devices="t01@1,t02@2", instance_id="a", serial={"url": "socket://x:1"}
    )
    agent = Agent(settings)
    leadership = RenewingLeadership()
    agent.leadership = leadership  # type: ignore[assignment]
    for name in ("t01", "t02"):
        keys = DeviceKeys(f"{name}\\setPoint", f"{name}\\synced", f"{name}\\line", "floor3")
        agent.devices[name] = DeviceSync(
            name,
            None,  # type: ignore[arg-type]  # nothing is read or written here
            None,  # type: ignore[arg-type]
            keys,
            StateFile(tmp_path, name),
            logging.getLogger("test"),
            lambda: False,
        )
    built: list[str] = []
    snapshot = reports.device_snapshot

    def counted(device_id: str, *args: Any, **options: Any) -> Snapshot:
        built.append(device_id)
        return snapshot(device_id, *args, **options)

    monkeypatch.setattr(agent_module, "device_snapshot", counted)
    first = agent.view()
    assert sorted(built) == ["t01", "t02"]
    assert first.token == leadership.token

    built.clear()
    leadership.renew()
    renewed = agent.view()
    assert built == []
    assert all(renewed.devices[name] is first.devices[name] for name in ("t01", "t02"))
    assert renewed.token == leadership.token  # the instance's document says the new one
    assert all(view.snapshot.fencing_token is None for view in renewed.devices.values())

    # What a device's document does show still rebuilds it: a lock lost, say.
    leadership.losses = 1
    agent.view()
    assert sorted(built) == ["t01", "t02"]
    # Telemetry's snapshot names the token.
    assert agent.snapshot("t01").fencing_token == str(leadership.token)
