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

Shown, a line fits a terminal: the pair, the devices while they fit (else those with a
problem, and a count of the others), the verdict.
"""

from __future__ import annotations

import json
import textwrap
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
    )


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
            snapshot.switchover, instances, devices,
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


def _value(value: float | None) -> str:
    return "" if value is None else number_text(value)


def _stored(text: str | None) -> str:
    """The store's value in the form the controller's is shown in, when it is a number
    (the store's `20.00` beside the controller's `20.0` would read as a difference)."""
    if text is None:
        return ""
    return stored_number_text(text.encode()) or text


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def table(
    title: str,
    headers: list[str],
    rows: list[list[str]],
    *,
    width: int | None = None,
    flexible: int = -1,
) -> list[str]:
    """A box table; the title sits in its top border, as patronictl shows a cluster. Wider
    than `width`, the `flexible` column's cells are cut (with …) to fit."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    flexible %= len(headers)
    over = sum(widths) + 3 * len(widths) + 1 - (width or 0)
    if width is not None and over > 0:
        widths[flexible] = max(len(headers[flexible]), widths[flexible] - over)
        rows = [
            [_cut(c, widths[flexible]) if i == flexible else c for i, c in enumerate(r)]
            for r in rows
        ]
    top = f"+ {title} "
    short = len(top) + 2 - (sum(widths) + 3 * len(widths) + 1)
    if short > 0:  # as wide as its title
        widths[-1] += short
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    top += "-" * (len(rule) - len(top) - 1) + "+"

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return [top, line(headers), rule, *(line(r) for r in rows), rule]


def _instance_table(report: Report, width: int | None) -> list[str]:
    rows = [
        [
            r.instance,
            r.role,
            r.state,
            age(r.lease_s),
            age(r.uptime_s),
            r.host or "",
            "" if r.pid is None else str(r.pid),
        ]
        for r in report.instances
    ]
    title = f"Line: {report.line}" + ("" if report.token is None else f", token {report.token}")
    headers = ["Instance", "Role", "State", "Lease", "Up", "Host", "Pid"]
    return table(title, headers, rows, width=width, flexible=5)


def _sync(device: DeviceRow) -> str:
    if device.reconciling:
        return "reconciling"
    if device.availability not in (None, "online"):
        return "paused" if device.problem == "paused" else device.availability or ""
    return "" if device.in_sync is None else "yes" if device.in_sync else "no"


DEVICE_HEADERS = ["Device", "Store", "Unit", "Temp", "In sync", "Synced", "Problem, errors"]
HUMIDITY_HEADER = "RH %"
"""After Temp, on a line where a unit reads humidity."""


def _errors(device: DeviceRow) -> str:
    return ", ".join(f"{ERROR_NAMES.get(k, k)} {v}" for k, v in device.errors.items())


def _device_headers(devices: list[DeviceRow], width: int | None = None) -> list[str]:
    """The columns: humidity beside the temperature where a unit reads it and the table still
    fits `width` with it."""
    if not any(d.humidity is not None for d in devices):
        return DEVICE_HEADERS
    at = DEVICE_HEADERS.index("Temp") + 1
    headers = [*DEVICE_HEADERS[:at], HUMIDITY_HEADER, *DEVICE_HEADERS[at:]]
    if width is not None:
        rows = _device_rows(devices, headers)
        used = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
        used[-1] = len(headers[-1])  # the last column is cut to fit, down to its header
        if sum(used) + 3 * len(headers) + 1 > width:
            return DEVICE_HEADERS
    return headers


def _device_rows(devices: list[DeviceRow], headers: list[str]) -> list[list[str]]:
    humid = HUMIDITY_HEADER in headers
    return [
        [
            d.device,
            _stored(d.store),
            _value(d.controller),
            _value(d.temperature),
            *([_value(d.humidity)] if humid else []),
            _sync(d),
            "" if d.last_sync_age_s is None else age(d.last_sync_age_s) + " ago",
            d.problem or _errors(d),
        ]
        for d in devices
    ]


def _last_column(devices: list[DeviceRow], width: int | None) -> int | None:
    """How wide the devices table's last column can be in `width` (None: any width)."""
    if width is None:
        return None
    headers = _device_headers(devices, width)
    rows = _device_rows(devices, headers)
    used = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers[:-1])]
    return width - sum(used) - 3 * len(headers) - 1


def _device_notes(device: DeviceRow, room: int | None) -> list[str]:
    """The lines under the table for a device: its refusal, and its counters when the
    table's cell cannot hold them all."""
    notes = [] if device.refused is None else [f" {device.device}: {device.refused}"]
    errors = _errors(device)
    if device.problem is None and errors and room is not None and len(errors) > room:
        notes.append(f" {device.device} errors: {errors}")
    return notes


def _device_table(report: Report, devices: list[DeviceRow], width: int | None) -> list[str]:
    headers = _device_headers(devices, width)
    rows = _device_rows(devices, headers)
    lines = table(f"Devices of {report.line}", headers, rows, width=width)
    room = _last_column(devices, width)
    notes = [note for d in devices for note in _device_notes(d, room)]
    return lines + [_cut(n, width) if width else n for n in notes]


def _device_lines(report: Report, rows: int | None, width: int | None, every: bool) -> list[str]:
    """Every device while they fit in `rows` (or with `every`); else those with a problem
    (as many as fit) and a count of the others."""
    devices = report.devices
    if not devices:
        return []

    # A subset's columns are no wider than all devices': its notes are no more than these.
    room = _last_column(devices, width)

    def cost(shown: list[DeviceRow]) -> int:
        notes = sum(len(_device_notes(d, room)) for d in shown)
        return 4 + len(shown) + notes if shown else 0

    if every or rows is None or cost(devices) <= rows:
        return _device_table(report, devices, width)
    shown: list[DeviceRow] = []
    for device in (d for d in devices if d.problem is not None or d.refused is not None):
        if cost([*shown, device]) + 1 > rows:
            break
        shown.append(device)
    rest = [d for d in devices if d not in shown]
    troubled = sum(d.problem is not None for d in rest)
    reconciling = sum(d.reconciling for d in rest)
    counts = [
        f"{n} {what}"
        for n, what in (
            (len(rest) - troubled - reconciling, "in sync"),
            (reconciling, "reconciling"),
            (troubled, "with a problem"),
        )
        if n
    ]
    more = "more " if shown else ""
    noun = "device" if len(rest) == 1 else "devices"
    summary = f" {len(rest)} {more}{noun}: {', '.join(counts)} (--all lists every device)"
    return [*(_device_table(report, shown, width) if shown else []), summary]


def render(
    report: Report, *, rows: int | None = None, width: int | None = None, every: bool = False
) -> str:
    """The view of one line, in `rows` x `width` when given: the pair, the devices that fit
    (those with a problem first), the verdict; `every` lists every device."""
    head = _instance_table(report, width)
    notes = []
    if report.paused is not None:
        notes.append(f" Paused: {report.paused.describe()}")
    if report.switchover is not None:
        request = report.switchover
        to = request.to or "any standby"
        notes.append(f" Switchover requested: {holder_instance(request.holder)} -> {to}")
    verdict = f" Status: {report.verdict} (exit {report.code})"
    tail = [_cut(n, width) if width else n for n in notes]
    tail += textwrap.wrap(verdict, width, subsequent_indent="   ") if width else [verdict]
    room = None if rows is None else rows - len(head) - len(tail)
    return "\n".join([*head, *_device_lines(report, room, width, every), *tail])


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
