"""Telemetry: a JSON document with CloudEvents attributes as MQTT user properties.

`build()` is pure; the agent publishes what it returns."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from agent.client.session import Session, SessionError

log = logging.getLogger("agent")

CONTENT_TYPE = "application/json"
EVENT_TYPE = "agent.telemetry.v1"
LINE_EVENT_TYPE = "agent.line.telemetry.v1"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One device, as one instance sees it."""

    device: str
    line: str
    instance: str
    role: str  # active | standby
    setpoint: float | None
    temperature: float | None
    output: int | None
    mode: str | None
    controller: str | None  # ok | unavailable | error; None for the standby
    fencing_token: str | None
    last_sync_time: str | None
    last_sync_version: str | None
    errors: dict[str, int]
    slow_ms: float | None = None
    """How long its transactions take, when the unit is slow (polled less often)."""
    points: dict[str, float | str | bool] | None = None
    """The unit's other points as last read (a unit with a profile)."""
    changes: dict[str, dict[str, str | None]] | None = None
    """Each point's last change this instance made: its value, source, time and version."""


@dataclass(frozen=True, slots=True)
class LineSnapshot:
    """The line itself: its traffic and health, as the active drives it."""

    line: str
    instance: str
    role: str
    devices: int
    available: int
    """Devices answering (not quarantined)."""
    line_up: bool | None
    transactions_per_s: float | None
    cycle_s: float | None
    errors: dict[str, int]
    round_trip_ms: float | None = None
    """The longest of this instance's last round trips to the store."""
    too_slow_for_lease: bool = False
    """The round trip is too long to hold a lease: this instance cannot take over (the
    pair has one usable gateway)."""


def build(
    snapshot: Snapshot | LineSnapshot, now: datetime | None = None
) -> tuple[bytes, list[tuple[str, str]]]:
    """The payload and the CloudEvents user properties of one telemetry message."""
    when = (now or datetime.now(UTC)).isoformat(timespec="milliseconds")
    payload = json.dumps(asdict(snapshot), separators=(",", ":")).encode()
    subject = snapshot.device if isinstance(snapshot, Snapshot) else f"line/{snapshot.line}"
    properties = [
        ("specversion", "1.0"),
        ("type", EVENT_TYPE if isinstance(snapshot, Snapshot) else LINE_EVENT_TYPE),
        ("source", f"agent/{subject}/{snapshot.instance}"),
        ("id", str(uuid.uuid4())),
        ("time", when.replace("+00:00", "Z")),
    ]
    return payload, properties


def iso_time(epoch_s: float | None) -> str | None:
    if epoch_s is None:
        return None
    stamp = datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


TELEMETRY_IN_FLIGHT = 8
"""Telemetry messages waiting for their acknowledgement at once."""


async def publish(
    session: Session, messages: list[tuple[str, Snapshot | LineSnapshot]], *, interval_s: float
) -> None:
    """Publishes each snapshot on its topic, each valid for three intervals, all at once:
    over a slow link, one after the other, the first whose acknowledgement took longer than
    an interval held back the rest (the line's own, last, was never sent). A few at a time
    (TELEMETRY_IN_FLIGHT): the session's window is shared with the lease's renewals."""
    in_flight = asyncio.Semaphore(TELEMETRY_IN_FLIGHT)

    async def one(topic: str, snapshot: Snapshot | LineSnapshot) -> None:
        payload, properties = build(snapshot)
        async with in_flight:
            await session.publish(
                topic,
                payload,
                qos=1,
                content_type=CONTENT_TYPE,
                message_expiry_interval=max(1, math.ceil(interval_s * 3)),
                user_properties=properties,
                timeout=max(1.0, interval_s),
            )

    sent = await asyncio.gather(*(one(t, s) for t, s in messages), return_exceptions=True)
    for result in sent:
        if isinstance(result, SessionError):
            log.debug("telemetry not published: %s", result)
            return
        if isinstance(result, BaseException):
            raise result
