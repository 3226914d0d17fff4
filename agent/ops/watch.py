"""Reading a line as `agent status` shows it: the lock, the pause and switchover keys and
every device's set point from the store; each instance's health and each device's status
from the agents' retained messages (agent.runtime.health)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agent.client.statestore import StateStoreClient
from agent.config import HealthSettings, KeySettings
from agent.message import Message
from agent.ops.control import InvalidRequest, PauseNote, SwitchoverRequest
from agent.ops.retained import Retained
from agent.ops.view import DeviceSnapshot, LineSnapshot


def document(message: Message | None) -> dict[str, Any] | None:
    if message is None:
        return None
    try:
        parsed = json.loads(message.payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return parsed if isinstance(parsed, dict) else None


def health_filter(health: HealthSettings, line: str = "+") -> str:
    """Every instance's health topic of `line` (or of every line)."""
    return health.topic.format(line=line, instance="+", device=line)


def lines_reported(retained: Retained) -> list[str]:
    """The lines of every health message received."""
    found = {doc.get("line") for doc in map(document, retained.messages.values()) if doc}
    return sorted(line for line in found if isinstance(line, str) and line)


class LineWatch:
    def __init__(
        self,
        client: StateStoreClient,
        retained: Retained,
        keys: KeySettings,
        health: HealthSettings,
        line: str,
        named_device: str | None = None,
    ) -> None:
        self.client = client
        self.retained = retained
        self.keys = keys
        self.health = health
        self.line = line
        self.named_device = named_device
        self._health_filter = health_filter(health, line)
        self._followed: set[str] = set()

    async def start(self) -> None:
        await self.retained.follow(self._health_filter)
        await self.retained.settle()

    def _health_documents(self) -> dict[str, dict[str, Any]]:
        found = {}
        prefix, _, suffix = self._health_filter.partition("+")
        for topic, message in self.retained.messages.items():
            if not (topic.startswith(prefix) and topic.endswith(suffix)):
                continue
            doc = document(message)
            if doc is None or doc.get("line") not in (None, self.line):
                continue
            name = doc.get("instance")
            found[name if isinstance(name, str) else topic] = doc
        return found

    async def read(self) -> LineSnapshot:
        """The line now: the store read afresh, the retained messages as they stand."""
        snapshot = LineSnapshot(self.line, named_device=self.named_device)
        snapshot.health = self._health_documents()
        devices = snapshot.device_ids()
        new = [d for d in devices if d not in self._followed]
        for device in new:
            await self.retained.follow(self.health.device_status_topic(device, self.line))
            self._followed.add(device)
        keys = self.keys
        lock_key = keys.of_line("lock", self.line)
        reads = [
            self.client.get(lock_key),
            self.client.get(keys.of_line("paused", self.line)),
            self.client.get(keys.of_line("switchover", self.line)),
            *(self.client.get(keys.of("setpoint", device=d, line=self.line)) for d in devices),
        ]
        results = await asyncio.gather(*reads)
        if new:
            await self.retained.settle()
        (holder, version), (paused, _), (request, _) = results[:3]
        snapshot.holder, snapshot.lock_version = holder, version if holder else None
        snapshot.paused = None if paused is None else PauseNote.parse(paused)
        if request is not None:
            try:
                snapshot.switchover = SwitchoverRequest.parse(request)
            except InvalidRequest:
                snapshot.switchover = None
        for device, (value, _) in zip(devices, results[3:], strict=True):
            topic = self.health.device_status_topic(device, self.line)
            status = document(self.retained.messages.get(topic))
            snapshot.devices[device] = DeviceSnapshot(value, status)
        return snapshot
