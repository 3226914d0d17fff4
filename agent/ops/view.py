"""`agent status`'s view of a line: what was read (a `LineSnapshot`), what it means (a
`Report`, with the exit code), and how it is shown (a table like `patronictl list`, or
JSON). Pure, no I/O: times are passed in.

Exit codes (the worst line's, with several lines):

- 0: one instance holds the lock and says it is up, a standby is up, every device answers
  and is in sync;
- 1: nobody holds the line's lock (no active), or no agent has ever reported for it;
- 5: degraded: an active, but no standby up, an instance failing or silent, or a device
  not answering, not in sync or not reported;
- 6: paused (maintenance): the active holds the lock and leaves the line alone.

2, 3 and 4 are those of `agent store`: usage, service error, connection failure.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from agent.client.lock import holder_instance
from agent.controller.points import number_text, stored_number_text
from agent.ops.control import PauseNote, SwitchoverRequest
from agent.protocol.hlc import Hlc, HlcError

OK, NO_ACTIVE, DEGRADED, PAUSED = 0, 1, 5, 6
SEVERITY = (OK, DEGRADED, PAUSED, NO_ACTIVE)
"""From best to worst: the code of several lines is the worst of theirs."""

STALE_HEARTBEATS = 3
"""An instance silent for this many heartbeats (plus a second) is not counted as up."""
DEFAULT_TTL_MS = 3000

ERROR_NAMES = {
    "invalid_remote_values": "invalid",
    "controller_errors": "controller",
    "store_errors": "store",
    "fenced_writes_rejected": "fenced",
    "lock_losses": "lock losses",
}


def worst(codes: list[int]) -> int:
    return max(codes, key=SEVERITY.index, default=NO_ACTIVE)


# --------------------------------------------------------------------------- input


@dataclass
class DeviceSnapshot:
    store: bytes | None = None
    """`<device>\\setPoint` as read from the store."""
    status: dict[str, Any] | None = None
    """The active's retained status of the device."""


@dataclass
class LineSnapshot:
    line: str
    holder: bytes | None = None
    lock_version: Hlc | None = None
    paused: PauseNote | None = None
    switchover: SwitchoverRequest | None = None
    health: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Instance id -> its retained health document."""
    devices: dict[str, DeviceSnapshot] = field(default_factory=dict)
    named_device: str | None = None
    """The device the operator named, if it was a device."""

    def device_ids(self) -> list[str]:
        """The devices the instances serve, the active's order first."""
        holder = holder_instance(self.holder) if self.holder is not None else None
        ordered = sorted(self.health, key=lambda name: name != holder)
        ids: list[str] = []
        for name in ordered:
            for device in self.health[name].get("devices") or []:
                if isinstance(device, str) and device not in ids:
                    ids.append(device)
        if self.named_device is not None and self.named_device not in ids:
            ids.append(self.named_device)
        return ids


# --------------------------------------------------------------------------- meaning


@dataclass
class InstanceRow:
    instance: str
    role: str
    state: str
    token: str | None
    lease_s: float | None
    heartbeat_age_s: float | None
    up: bool
    version: str | None
    summary: str | None


@dataclass
class DeviceRow:
    device: str
    store: str | None
    controller: float | None
    temperature: float | None
    in_sync: bool | None
    last_sync: str | None
    last_sync_age_s: float | None
    availability: str | None
    errors: dict[str, int]
    problem: str | None
    refused: str | None = None
    """The last remote value the unit could not take, and why."""


@dataclass
class Report:
    line: str
    code: int
    verdict: str
    problems: list[str]
    holder: str | None
    token: str | None
    lease_s: float | None
    paused: PauseNote | None
    switchover: SwitchoverRequest | None
    instances: list[InstanceRow]
    devices: list[DeviceRow]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _epoch(iso: Any) -> float | None:
    if not isinstance(iso, str):
        return None
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _instance_row(
    name: str, doc: dict[str, Any], holder: str | None, lease: float | None, token: str | None,
    now: float,
) -> InstanceRow:  # fmt: skip
    sent = _number(doc.get("time"))
    heartbeat = _number(doc.get("heartbeat_s")) or 5.0
    age = None if sent is None else round(max(0.0, now - sent), 3)
    status = doc.get("status")
    up = status == "up" and age is not None and age <= STALE_HEARTBEATS * heartbeat + 1
    own_role = str(doc.get("role") or "?")
    if status == "down":
        role, state = "down", str(doc.get("reason") or "down")
    elif not up:
        role, state = own_role, "silent"
    else:
        role, state = own_role, str(doc.get("state") or "?")
    if name == holder:
        role = "active"
    elif role == "active":
        role = "active, no lock"  # it has not said otherwise yet, or it is wrong
    version = doc.get("version")
    summary = doc.get("summary")
    return InstanceRow(
        instance=name,
        role=role,
        state=state,
        token=token if name == holder else None,
        lease_s=lease if name == holder else None,
        heartbeat_age_s=age,
        up=up,
        version=str(version) if version is not None else None,
        summary=str(summary) if summary is not None else None,
    )


def _device_row(device: str, snapshot: DeviceSnapshot, holder: str | None, now: float) -> DeviceRow:
    status = snapshot.status or {}
    store = None if snapshot.store is None else snapshot.store.decode(errors="replace")
    errors = status.get("errors")
    counted = (
        {k: v for k, v in errors.items() if isinstance(v, int) and v}
        if isinstance(errors, dict)
        else {}
    )
    availability = status.get("availability")
    in_sync = status.get("in_sync") if isinstance(status.get("in_sync"), bool) else None
    last_sync = status.get("last_sync")
    synced_at = _epoch(last_sync)
    problem = None
    if not status:
        problem = "no status reported"
    elif holder is not None and status.get("instance") != holder:
        problem = f"status from {status.get('instance')}, not the active"
    elif availability != "online":
        problem = "paused" if status.get("controller") == "paused" else "not answering"
    elif not in_sync:
        problem = "not in sync"
    refused = status.get("refused")
    refusal = (
        f"{refused.get('point')} {refused.get('value')} refused: {refused.get('reason')}"
        if isinstance(refused, dict)
        else None
    )
    return DeviceRow(
        refused=refusal,
        device=device,
        store=store,
        controller=_number(status.get("setpoint")),
        temperature=_number(status.get("temperature")),
        in_sync=in_sync,
        last_sync=last_sync if isinstance(last_sync, str) else None,
        last_sync_age_s=None if synced_at is None else round(max(0.0, now - synced_at), 3),
        availability=availability if isinstance(availability, str) else None,
        errors=counted,
        problem=problem,
    )


def assess(snapshot: LineSnapshot, now: float) -> Report:
    """What the snapshot means; `now` is the wall clock (seconds since the epoch)."""
    holder = holder_instance(snapshot.holder) if snapshot.holder is not None else None
    token = str(snapshot.lock_version) if snapshot.lock_version is not None else None
    holder_doc = snapshot.health.get(holder or "", {})
    ttl_ms = _number(holder_doc.get("ttl_ms")) or DEFAULT_TTL_MS
    lease = None
    if snapshot.lock_version is not None and holder is not None:
        lease = round(max(0.0, (snapshot.lock_version.wall_ms + ttl_ms) / 1000 - now), 3)
    names = sorted(snapshot.health, key=lambda name: (name != holder, name))
    if holder is not None and holder not in snapshot.health:
        names.insert(0, holder)
    instances = [
        _instance_row(name, snapshot.health.get(name, {}), holder, lease, token, now)
        for name in names
    ]
    devices = [
        _device_row(d, snapshot.devices.get(d, DeviceSnapshot()), holder, now)
        for d in snapshot.device_ids()
    ]

    problems: list[str] = []
    if holder is None:
        seen = snapshot.health or any(d.status for d in snapshot.devices.values())
        verdict = "no active: nobody holds the lock" if seen else "no agent has reported"
        return Report(
            snapshot.line, NO_ACTIVE, verdict, [verdict], None, None, None,
            snapshot.paused, snapshot.switchover, instances, devices,
        )  # fmt: skip
    active_row = instances[0]
    if not active_row.up:
        problems.append(f"the active {holder} does not report (no health heartbeat)")
    elif active_row.state == "failing":
        problems.append(f"the active {holder} is failing")
    standbys = [r for r in instances[1:] if r.up and r.role == "standby"]
    for row in instances[1:]:
        if row.up and row.state == "failing":
            problems.append(f"{row.instance} is failing")
    if not any(r.state != "failing" for r in standbys):
        problems.append("no standby")
    if snapshot.paused is not None:
        verdict = f"paused: {snapshot.paused.describe()}"
        return Report(
            snapshot.line, PAUSED, verdict, problems, holder, token, lease, snapshot.paused,
            snapshot.switchover, instances, devices,
        )  # fmt: skip
    problems += [f"{d.device} {d.problem}" for d in devices if d.problem is not None]
    code = DEGRADED if problems else OK
    verdict = "degraded: " + "; ".join(problems) if problems else "ok"
    return Report(
        snapshot.line, code, verdict, problems, holder, token, lease, snapshot.paused,
        snapshot.switchover, instances, devices,
    )  # fmt: skip


# --------------------------------------------------------------------------- showing


def age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


def _value(value: float | None) -> str:
    return "" if value is None else number_text(value)


def _stored(text: str | None) -> str:
    """The store's value in the form the controller's is shown in, when it is a number
    (the store's `20.00` beside the controller's `20.0` would read as a difference)."""
    if text is None:
        return ""
    return stored_number_text(text.encode()) or text


def table(title: str, headers: list[str], rows: list[list[str]]) -> list[str]:
    """A box table; the title sits in its top border, as patronictl shows a cluster."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    top = f"+ {title} "
    top = top + rule[len(top) :] if len(top) < len(rule) else top + "-+"

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return [top, line(headers), rule, *(line(r) for r in rows), rule]


def render(report: Report) -> str:
    instances = [
        [
            r.instance,
            r.role,
            r.state,
            r.token or "",
            age(r.lease_s),
            "" if r.heartbeat_age_s is None else age(r.heartbeat_age_s) + " ago",
            r.version or "",
        ]
        for r in report.instances
    ]
    out = table(
        f"Line: {report.line}",
        ["Instance", "Role", "State", "Token", "Lease", "Heartbeat", "Version"],
        instances,
    )
    if report.devices:
        rows = [
            [
                d.device,
                _stored(d.store),
                _value(d.controller),
                _value(d.temperature),
                "" if d.in_sync is None else "yes" if d.in_sync else "no",
                "" if d.last_sync_age_s is None else age(d.last_sync_age_s) + " ago",
                d.availability or "",
                ", ".join(f"{ERROR_NAMES.get(k, k)} {v}" for k, v in d.errors.items()),
            ]
            for d in report.devices
        ]
        headers = ["Device", "Store", "Controller", "Temp", "In sync", "Last sync",
                   "Availability", "Errors"]  # fmt: skip
        out += table(f"Devices of {report.line}", headers, rows)
        out += [f" {d.device}: {d.refused}" for d in report.devices if d.refused is not None]
    if report.paused is not None:
        out.append(f" Paused: {report.paused.describe()}")
    if report.switchover is not None:
        request = report.switchover
        to = request.to or "any standby"
        out.append(f" Switchover requested: {holder_instance(request.holder)} -> {to}")
    out.append(f" Status: {report.verdict} (exit {report.code})")
    return "\n".join(out)


def as_json(reports: list[Report]) -> str:
    def line(report: Report) -> dict[str, Any]:
        document = asdict(report)
        document["paused"] = None if report.paused is None else asdict(report.paused)
        document["switchover"] = None if report.switchover is None else asdict(report.switchover)
        return document

    code = worst([r.code for r in reports])
    return json.dumps({"code": code, "lines": [line(r) for r in reports]}, indent=2)


def parse_lock_version(text: str | None) -> Hlc | None:
    if text is None:
        return None
    try:
        return Hlc.parse(text)
    except HlcError:
        return None
