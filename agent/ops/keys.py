"""Where a device's things are in the store, for tools that know only the device.

The agent serving a device's line writes `<device>\\line` (the line's id) when it takes
over; the line's lock `<line>\\lock` fences every write of `<device>\\setPoint`. A writer
reads the first two and writes the third with the lock's current version as fencing token
(protocol.md §5). The key templates are the agent's own (AGENT_KEYS__*).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.client.cli import UsageError, env_file_of
from agent.client.errors import FencingTokenLowerVersion
from agent.client.line_env import readable
from agent.client.statestore import SetResult, StateStoreClient
from agent.config import (
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    HealthSettings,
    KeySettings,
    TelemetrySettings,
)
from agent.protocol.hlc import Hlc


class KeyTemplates(BaseSettings):
    """The key templates, health and telemetry topics from the environment, as the agent
    reads them."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED_DELIMITER, extra="ignore"
    )

    keys: KeySettings = Field(default_factory=KeySettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)


def key_templates(args: argparse.Namespace) -> KeyTemplates:
    """The templates a command uses: the environment's, over its env file's (as for its
    connection; an --env-file that cannot be read is said there)."""
    try:
        env_file = readable(env_file_of(args))
    except UsageError:
        env_file = None
    return KeyTemplates(_env_file=env_file, _env_file_encoding="utf-8")  # type: ignore[call-arg]


class NoLine(LookupError):
    """No agent has said which line serves the device."""


class NoActive(LookupError):
    """Nobody holds the line's lock: no active agent to fence with."""


@dataclass(frozen=True, slots=True)
class DeviceKeys:
    device: str
    line: str
    setpoint: str
    synced: str
    lock: str


async def find(client: StateStoreClient, device: str, keys: KeySettings) -> DeviceKeys:
    """The device's keys, its line found in the store (NoLine when it is not there)."""
    line_key = keys.of("line", device=device, line=device)
    line, _ = await client.get(line_key)
    if line is None:
        raise NoLine(f"{line_key} is not in the store: is an agent serving {device}?")
    line_id = line.decode(errors="replace")
    return DeviceKeys(
        device=device,
        line=line_id,
        setpoint=keys.of("setpoint", device=device, line=line_id),
        synced=keys.of("synced", device=device, line=line_id),
        lock=keys.lock.format(line=line_id, device=line_id),
    )


async def fenced_set(
    client: StateStoreClient,
    keys: DeviceKeys,
    value: bytes,
    *,
    attempts: int = 3,
    key: str | None = None,
) -> tuple[SetResult, Hlc]:
    """SET the set point (or `key`, another point's), fenced with the lock's current
    version; returns the result and the token used. The active writes with a newer token
    after each renewal, so a refusal for a lower version is tried again with the lock's
    version read anew."""
    for attempt in range(attempts):
        holder, token = await client.get(keys.lock)
        if holder is None or token is None:
            raise NoActive(f"nobody holds {keys.lock}: no active agent on line {keys.line}")
        try:
            return await client.set(key or keys.setpoint, value, fencing_token=token), token
        except FencingTokenLowerVersion:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover
