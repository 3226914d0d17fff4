"""`agent status`'s view of a line: what was read (a `LineSnapshot`), what it means (a
`Report`, with the exit code), and how it is shown (a table like `patronictl list`, or
JSON). Pure, no I/O: times are passed in.

Exit codes (the worst line's, with several lines):

- 0: one instance holds the lock and says it is up, a standby is up, every device answers
  and is in sync;
- 1: nobody holds the line's lock (no active), or no agent has ever reported for it;
- 5: degraded: an active, but no standby ready to take over (none up, one not responding,
  failing or not ready), the active not responding, failing or still taking over, the
  instances running different configurations, a device claimed by another line too, or a
  device not answering, not in sync or not reported (one being reconciled after a takeover
  is no problem);
- 6: paused (maintenance): the active holds the lock and leaves the line alone.

2, 3 and 4 are those of `agent store`: usage, service error, connection failure.

The lock says who is active, whatever an instance claims; an instance whose heartbeat is
stale is "not responding", whatever it said last. What older agents do not say (uptime,
configuration hash, readiness, a takeover's lock delay, reconciling, conflicts) is left out.

How a report is shown as text is agent.ops.view_text.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from agent.client.lock import holder_instance
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
    host: str | None = None
    pid: int | None = None
    uptime_s: float | None = None
    """Since its process started (`started_at`), while it is up."""
    config_hash: str | None = None
    ready: bool | None = None
    """False: a standby that could not take over (`not_ready` says why); None: not said."""
    not_ready: str | None = None
    taking_over_s: float | None = None
    """Holding the lock, the lock delay still left (now, not when it was said)."""
    reconciling: int | None = None
    """Devices not yet reconciled since the takeover (the active)."""
    conflicts: list[dict[str, str]] = field(default_factory=list)
    """Devices another line claims too, left alone here: device, line."""
    problem: str | None = None
    """Why it says it is failing."""
    reload_refused: str | None = None
    """Why its last reload was refused, until one loads: its files would fail a restart."""

    @property
    def can_take_over(self) -> bool:
        return (
            self.up
            and self.role == "standby"
            and self.state != "failing"
            and self.ready is not False
        )


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
    reconciling: bool = False
    """Being reconciled after a takeover: store and unit may differ for a moment."""
    served_by: str | None = None
    """Another line that serves it (configured on both): this line leaves it alone."""
    humidity: float | None = None
    """Relative humidity (%), of a unit whose profile reads it."""
    changes: list[str] = field(default_factory=list)
    """Each point's last change: value, where it came from (panel, remote, restored after
    a refusal or an absence, the unit's after an absence), how long ago, its version."""


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
    named: str | None = None
    """The device the operator named: its points' last changes are shown."""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _epoch(iso: Any) -> float | None:
    if not isinstance(iso, str):
        return None
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _conflicts(value: Any) -> list[dict[str, str]]:
    found = []
    for item in value if isinstance(value, list) else []:
        if isinstance(item, dict):
            device, line = _text(item.get("device")), _text(item.get("line"))
            if device is not None and line is not None:
                found.append({"device": device, "line": line})
    return found


def _instance_row(
    name: str, doc: dict[str, Any], holder: str | None, lease: float | None, token: str | None,
    now: float,
) -> InstanceRow:  # fmt: skip
    sent = _number(doc.get("time"))
    heartbeat = _number(doc.get("heartbeat_s")) or 5.0
    age = None if sent is None else round(max(0.0, now - sent), 3)
    status = doc.get("status")
    own_role = str(doc.get("role") or "?")
    silent_after = STALE_HEARTBEATS * heartbeat + 1
    if own_role == "active" and holder is not None and name != holder:
        # Another holds the lock: a live instance says it is no longer active within a
        # lease or so; one that still says it after two is frozen or cut off.
        ttl_s = (_number(doc.get("ttl_ms")) or DEFAULT_TTL_MS) / 1000
        silent_after = min(silent_after, 2 * ttl_s + 1)
    up = status == "up" and age is not None and age <= silent_after
    ready = doc.get("ready") if isinstance(doc.get("ready"), bool) else None
    taking_over = _number(doc.get("taking_over_s"))
    if taking_over is not None and age is not None:
        taking_over = round(max(0.0, taking_over - age), 1)  # said `age` seconds ago
    if status == "down":
        role, state = "down", str(doc.get("reason") or "down")
    elif not up:
        # A frozen process, a lost link the will has not told yet: what it said last is
        # no longer true, whatever role it claimed.
        role = "not responding"
        state = "never heard" if age is None else f"heard {_age(age)} ago"
    elif name == holder and taking_over is not None and taking_over > 0:
        role, state = own_role, "taking over"
    elif own_role != "active" and ready is False:
        role, state = own_role, "not ready"
    else:
        role, state = own_role, str(doc.get("state") or "?")
    if name == holder:
        role = "active"
    elif role == "active":
        role = "active, no lock"  # it has not said otherwise yet, or it is wrong
    version = doc.get("version")
    summary = doc.get("summary")
    started = _number(doc.get("started_at"))
    pid = doc.get("pid")
    reconciling = doc.get("reconciling")
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
        host=_text(doc.get("host")),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        uptime_s=None if started is None or not up else round(max(0.0, now - started), 3),
        config_hash=_text(doc.get("config_hash")),
        ready=ready,
        not_ready=_text(doc.get("not_ready")),
        taking_over_s=taking_over if name == holder and up else None,
        reconciling=reconciling if isinstance(reconciling, int) and up else None,
        conflicts=_conflicts(doc.get("conflicts")) if up else [],
        problem=_text(doc.get("problem")),
        reload_refused=_text(doc.get("reload_refused")) if up else None,
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
    reconciling = status.get("reconciling") is True
    served_by = _text(status.get("served_by"))
    last_sync = status.get("last_sync")
    synced_at = _epoch(last_sync)
    problem = None
    if not status:
        problem = "no status reported"
    elif holder is not None and status.get("instance") != holder:
        problem = f"status from {status.get('instance')}, not the active"
    elif served_by is not None:
        problem = f"left to line {served_by}"
    elif availability != "online":
        problem = "paused" if status.get("controller") == "paused" else "not answering"
    elif not in_sync and not reconciling:
        problem = "not in sync"
    refused = status.get("refused")
    refusal = None
    if isinstance(refused, dict):
        when = parse_lock_version(_text(refused.get("version")))
        ago = "" if when is None else f" {_age(max(0.0, now - when.wall_ms / 1000))} ago"
        refusal = (
            f"{refused.get('point')} {refused.get('value')} refused{ago}: {refused.get('reason')}"
        )
    points = status.get("points")
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
        reconciling=reconciling and problem is None,
        served_by=served_by,
        humidity=_number(points.get("humidity")) if isinstance(points, dict) else None,
        changes=_changes(status.get("changes"), now),
    )


def _changes(value: Any, now: float) -> list[str]:
    """`setPoint 22.5: remote, 3 s ago (version ...)`, a point a line."""
    if not isinstance(value, dict):
        return []
    said = []
    for point, change in value.items():
        if not isinstance(change, dict):
            continue
        at = _epoch(change.get("at"))
        ago = "" if at is None else f", {_age(max(0.0, now - at))} ago"
        version = _text(change.get("version"))
        shown = f"{point} {change.get('value')}: {change.get('source')}{ago}"
        said.append(shown + ("" if version is None else f" (version {version})"))
    return said


def _instance_problems(line: str, instances: list[InstanceRow], holder: str) -> list[str]:
    """What is wrong with the instances, the lock's holder first: the lock says who is
    active, whatever an instance claims."""
    problems: list[str] = []
    active = instances[0]
    if active.state == "taking over":
        problems.append(
            f"{holder} taking over: waiting for the previous lease to end "
            f"({active.taking_over_s:.1f} s left)"
        )
    elif active.heartbeat_age_s is None:
        problems.append(f"the active {holder} does not report (no health heartbeat)")
    elif not active.up:
        problems.append(f"the active {holder} {_not_responding(active)}")
    elif active.state == "failing" and not active.conflicts:
        problems.append(f"the active {holder} is failing" + _why(active.problem))
    explained = False
    for row in instances[1:]:
        if row.role == "not responding":
            problems.append(f"{row.instance} {_not_responding(row)}")
        elif row.up and row.ready is False and row.role != "active, no lock":
            problems.append(f"{row.instance} cannot take over: {row.not_ready or 'not ready'}")
        elif row.up and row.state == "failing":
            problems.append(f"{row.instance} is failing" + _why(row.problem))
        else:
            continue
        explained = True
    if not any(r.can_take_over for r in instances[1:]) and not explained:
        problems.append("no standby")
    problems += [
        f"{r.instance} refused a reload (a restart would fail the same way): {r.reload_refused}"
        for r in instances
        if r.reload_refused is not None
    ]
    hashes = {r.config_hash for r in instances if r.up and r.config_hash}
    if len(hashes) > 1:
        shown = ", ".join(
            f"{r.instance} {r.config_hash}" for r in instances if r.up and r.config_hash
        )
        problems.append(f"the instances run different configurations ({shown})")
    claimed: dict[str, str] = {}
    for row in instances:
        for conflict in row.conflicts:
            claimed.setdefault(conflict["device"], conflict["line"])
    problems += [
        f"{device} is configured on lines {line} and {other}: served by {other} only"
        for device, other in claimed.items()
    ]
    return problems


def _not_responding(row: InstanceRow) -> str:
    heard = "" if row.heartbeat_age_s is None else f" (last heard {_age(row.heartbeat_age_s)} ago)"
    return f"is not responding{heard}"


def _why(problem: str | None) -> str:
    return "" if problem is None else f": {problem}"


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

    def report(code: int, verdict: str, problems: list[str]) -> Report:
        return Report(
            snapshot.line, code, verdict, problems, holder, token, lease, snapshot.paused,
            snapshot.switchover, instances, devices, snapshot.named_device,
        )  # fmt: skip

    if holder is None:
        seen = snapshot.health or any(d.status for d in snapshot.devices.values())
        verdict = "no active: nobody holds the lock" if seen else "no agent has reported"
        return report(NO_ACTIVE, verdict, [verdict])
    problems = _instance_problems(snapshot.line, instances, holder)
    if snapshot.paused is not None:
        return report(PAUSED, f"paused: {snapshot.paused.describe()}", problems)
    conflicting = {c["device"] for row in instances for c in row.conflicts}
    troubled = [d for d in devices if d.problem is not None and d.device not in conflicting]
    if instances[0].state == "taking over":
        troubled = []  # nobody drives the devices yet: what they say is not news
    problems += [f"{d.device} {d.problem}" for d in troubled]
    if problems:
        shown = problems[: len(problems) - len(troubled)] + _grouped(troubled)
        return report(DEGRADED, "degraded: " + "; ".join(shown), problems)
    reconciling = sum(d.reconciling for d in devices) or instances[0].reconciling or 0
    if reconciling:
        noun = "device" if reconciling == 1 else "devices"
        return report(OK, f"ok, reconciling {reconciling} {noun} after the takeover", [])
    return report(OK, "ok", [])


def _grouped(devices: list[DeviceRow]) -> list[str]:
    """Devices with the same problem said once: `30 devices not answering (t01, t02, +28)`."""
    by_problem: dict[str, list[str]] = {}
    for device in devices:
        by_problem.setdefault(device.problem or "", []).append(device.device)
    return [
        f"{names[0]} {problem}"
        if len(names) == 1
        else f"{len(names)} devices {problem} ({_named(names)})"
        for problem, names in by_problem.items()
    ]


def _named(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f", +{len(names) - shown}" if len(names) > shown else "")


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
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


_age = age


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
