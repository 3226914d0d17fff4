"""The line's configuration in a few hex digits, for a pair to compare. Pure.

Both gateways of a pair must drive the line alike: the same devices at the same addresses
with the same profiles, the same line settings, keys and lease. Each instance publishes
this hash in its health; `agent status` shows a pair that disagrees as a problem. What may
rightly differ between two gateways stays out: the serial port's path or URL (each has its
own adapter), the instance id, the broker connection and its credentials, the state
directory, log level, health and telemetry settings.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.config.settings import AgentSettings


HASH_DIGITS = 12


def line_config(settings: AgentSettings) -> dict[str, Any]:
    """What the hash covers, as plain data."""
    line = settings.line
    return {
        "line": line.id,
        "single": line.single,
        "devices": [
            {
                **device.model_dump(mode="json"),
                "profile": None
                if device.resolved_profile is None
                else repr(device.resolved_profile),
            }
            for device in line.devices
        ],
        "serial": settings.serial.model_dump(mode="json", exclude={"url", "lock_dir"}),
        "keys": settings.keys.model_dump(mode="json"),
        "lock": settings.lock.model_dump(mode="json"),
        "reconcile_interval_s": settings.reconcile_interval_s,
    }


def config_hash(settings: AgentSettings) -> str:
    text = json.dumps(line_config(settings), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_DIGITS]
