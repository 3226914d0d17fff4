"""`agent status`'s view of a line as text (agent.ops.view has what it means): a table like
`patronictl list` that fits a terminal, the pair, the devices while they fit (else those
with a problem, and a count of the others), the verdict. Pure, no I/O.
"""

from __future__ import annotations

import textwrap

from agent.client.lock import holder_instance
from agent.controller.points import number_text, stored_number_text
from agent.ops.view import ERROR_NAMES, DeviceRow, Report, age


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


def _device_notes(device: DeviceRow, room: int | None, named: str | None = None) -> list[str]:
    """The lines under the table for a device: its refusal, and its counters when the
    table's cell cannot hold them all."""
    notes = [] if device.refused is None else [f" {device.device}: {device.refused}"]
    errors = _errors(device)
    if device.problem is None and errors and room is not None and len(errors) > room:
        notes.append(f" {device.device} errors: {errors}")
    if device.device == named:  # the device the operator asked about: where changes came from
        notes += [f" {device.device} {change}" for change in device.changes]
    return notes


def _device_table(report: Report, devices: list[DeviceRow], width: int | None) -> list[str]:
    headers = _device_headers(devices, width)
    rows = _device_rows(devices, headers)
    lines = table(f"Devices of {report.line}", headers, rows, width=width)
    room = _last_column(devices, width)
    notes = [note for d in devices for note in _device_notes(d, room, report.named)]
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
        notes = sum(len(_device_notes(d, room, report.named)) for d in shown)
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
