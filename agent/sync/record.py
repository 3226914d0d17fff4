"""The sync record: what the active last had on a controller, kept in the store.

The active writes it (fenced) after every sync, to `<device>\\synced`, so that whoever
takes over can tell a panel change the former active had not published from a remote change
it had not applied (see `decisions.takeover_base`). Pure: encoding and parsing only.

The value is compact JSON: `{"value":21.5,"version":"001700000000000:00003:statestore"}`,
where version is the set point key's version at that sync. While a write of a remote change
to the controller is in doubt (recorded before the write goes out, settled by its read-back)
the record also names it, `"pending":[{"value":22.0,"version":"..."}]`, so that whoever
takes over knows a controller holding 22.0 holds the former active's write, not a panel
change (see `decisions.settled`).

A unit with a profile has more points (agent.controller.points); each has the same under
`"points"`: `"points":{"mode":{"value":"heat","version":"...","pending":[...]}}` (a number
as a JSON number, a choice as a string, a switch as true or false). The set point stays at
the top, so that a reader of the set point alone sees no change. Beside them, for operators
and their tools: the limits of each number the unit takes (`"limits":{"setPoint":[5,35,0.5]}`)
and the last remote value the unit could not take, with why (`"refused":{"point":"setPoint",
"value":"99","version":"...","reason":"99 is above the limit 35"}`).

A panel change is published to the point's key and recorded right after, both sent at once
on one connection: a record saying `"published":28.5` tells whoever takes over that 28.5
reached the store before the record did, so that a later value in the store is newer than
it, even if the former active died before it could record 28.5's version; unless the
store's value is older than the record, then the store refused 28.5 (see
`decisions.published_marker`). A publish whose answer never came (timed out) is named in
every record after as `"unanswered":28.5`, until the point syncs again: the store may have
28.5, and whoever takes over counts it so.

Beside `"published"`, `"publishedAfter"` is the token the publish went out with: older than
the version the store gave it, if it took it. A takeover that watched the key all along
knows from it whether the store did (see `history.StoreHistory.reached_store`).

`"away":true` says the unit left the line (quarantined, or the line lost) and has not synced
since: whoever takes over judges it as a unit back from an absence
(`decisions.after_absence`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.controller.interface import Limits, PointValue
from agent.controller.points import POINTS, Kind
from agent.protocol.hlc import Hlc, HlcError
from agent.sync.decisions import MAX_PENDING, Synced

MAX_RECORD_BYTES = 4096
MAX_REASON = 200


class InvalidRecord(ValueError):
    """The store holds something that is not a sync record."""


@dataclass(frozen=True, slots=True)
class PointRecord:
    synced: Synced
    pending: tuple[Synced, ...] = ()
    """Writes to the controller issued and not confirmed, oldest first."""
    published: PointValue | None = None
    """A value the active published to the point's key right before this record (sent
    after it on the same connection): the store had it before it had the record."""
    unanswered: PointValue | None = None
    """A value the active published whose answer never came (timed out): the store may
    have it. Kept in every record after, until the point syncs again."""
    published_after: Hlc | None = None
    """Beside `published`: the token the publish was sent with, older than the version the
    store gave it, if it took it (see history.StoreHistory.reached_store)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A remote value the unit could not take: restored in the key, and why."""

    point: str
    value: str
    version: Hlc | None
    reason: str


@dataclass(frozen=True, slots=True)
class SyncRecord:
    synced: Synced
    pending: tuple[Synced, ...] = ()
    """The set point's writes to the controller issued and not confirmed, oldest first."""
    points: Mapping[str, PointRecord] = field(default_factory=dict)
    """The unit's other points."""
    limits: Mapping[str, Limits] = field(default_factory=dict)
    refused: Refusal | None = None

    published: PointValue | None = None
    """The set point's: see PointRecord.published."""
    unanswered: PointValue | None = None
    """The set point's: see PointRecord.unanswered."""
    published_after: Hlc | None = None
    """The set point's: see PointRecord.published_after."""
    away: bool = False
    """The unit left the line (quarantined, or the line lost) and has not synced since:
    whoever takes over judges it as a unit back from an absence (decisions.after_absence)."""

    def point(self, name: str) -> PointRecord | None:
        if name == "setPoint":
            return PointRecord(
                self.synced, self.pending, self.published, self.unanswered, self.published_after
            )
        return self.points.get(name)


def encode_record(
    synced: Synced,
    pending: tuple[Synced, ...] = (),
    *,
    points: Mapping[str, PointRecord] | None = None,
    limits: Mapping[str, Limits] | None = None,
    refused: Refusal | None = None,
    published: PointValue | None = None,
    unanswered: PointValue | None = None,
    published_after: Hlc | None = None,
    away: bool = False,
) -> bytes:
    if synced.value is None or synced.version is None:
        raise ValueError("only a complete sync (value and version) is recorded")
    data: dict[str, Any] = _point_entry(
        PointRecord(synced, pending, published, unanswered, published_after)
    )
    if points:
        data["points"] = {
            name: _point_entry(entry)
            for name, entry in points.items()
            if entry.synced.value is not None and entry.synced.version is not None
        }
    if limits:
        data["limits"] = {name: [lim.min, lim.max, lim.step] for name, lim in limits.items()}
    if refused is not None:
        data["refused"] = {
            "point": refused.point,
            "value": refused.value[:64],
            "version": None if refused.version is None else str(refused.version),
            "reason": refused.reason[:MAX_REASON],
        }
    if away:
        data["away"] = True
    return json.dumps(data, separators=(",", ":")).encode()


def _point_entry(entry: PointRecord) -> dict[str, Any]:
    data = _entry(entry.synced)
    if entry.pending:
        data["pending"] = [_entry(write) for write in entry.pending[-MAX_PENDING:]]
    if entry.published is not None:
        data["published"] = entry.published
        if entry.published_after is not None:
            data["publishedAfter"] = str(entry.published_after)
    if entry.unanswered is not None:
        data["unanswered"] = entry.unanswered
    return data


def _entry(synced: Synced) -> dict[str, Any]:
    if synced.value is None or synced.version is None:
        raise ValueError("only a complete write (value and version) is recorded")
    return {"value": synced.value, "version": str(synced.version)}


def parse_record(raw: bytes) -> Synced:
    """The set point's sync the record holds (see `parse_full_record` for the rest)."""
    return parse_full_record(raw).synced


def parse_full_record(raw: bytes) -> SyncRecord:
    if len(raw) > MAX_RECORD_BYTES:
        raise InvalidRecord(f"a record of {len(raw)} bytes is too long")
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise InvalidRecord("not a JSON object")
        entries = data.get("points", {})
        if not isinstance(entries, dict):
            raise InvalidRecord("points must be an object")
        return SyncRecord(
            _parse_entry(data, "setPoint"),
            _parse_pending(data, "setPoint"),
            {
                name: PointRecord(
                    _parse_entry(entry, name),
                    _parse_pending(entry, name),
                    _parse_published(entry, name),
                    _parse_published(entry, name, "unanswered"),
                    _parse_version(entry, "publishedAfter"),
                )
                for name, entry in entries.items()
                if name in POINTS and name != "setPoint"
            },
            _parse_limits(data.get("limits", {})),
            _parse_refusal(data.get("refused")),
            _parse_published(data, "setPoint"),
            _parse_published(data, "setPoint", "unanswered"),
            _parse_version(data, "publishedAfter"),
            data.get("away") is True,
        )
    except InvalidRecord:
        raise
    except (ValueError, TypeError, KeyError, HlcError, RecursionError, AttributeError) as exc:
        shown = raw[:64].decode("utf-8", errors="backslashreplace")
        raise InvalidRecord(f"not a sync record: {shown!r} ({exc})") from None


def _parse_pending(data: Any, name: str) -> tuple[Synced, ...]:
    pending = data.get("pending", [])
    if not isinstance(pending, list) or len(pending) > MAX_PENDING:
        raise InvalidRecord(f"pending must be a list of at most {MAX_PENDING} writes")
    return tuple(_parse_entry(entry, name) for entry in pending)


def _parse_published(data: Any, name: str, key: str = "published") -> PointValue | None:
    value = data.get(key)
    return None if value is None else point_value(name, value)


def _parse_version(data: Any, key: str) -> Hlc | None:
    version = data.get(key)
    if version is None:
        return None
    if not isinstance(version, str):
        raise InvalidRecord("a version is a text")
    return Hlc.parse(version)


def _parse_entry(data: Any, name: str) -> Synced:
    value, version = data["value"], data["version"]
    if not isinstance(version, str):
        raise InvalidRecord("a version is a text")
    return Synced(point_value(name, value), Hlc.parse(version))


def point_value(name: str, value: Any) -> PointValue:
    """A point's value as JSON holds it, checked against the point's kind (a mode is one of
    its choices, occupancy true or false, a number finite): what a record or a state file
    says it synced."""
    kind = POINTS[name].kind
    if kind is Kind.SWITCH:
        if not isinstance(value, bool):
            raise InvalidRecord(f"{name}'s value is not true or false: {value!r}")
        return value
    if kind is Kind.CHOICE:
        if value not in POINTS[name].choices:
            raise InvalidRecord(f"{name}'s value is not one of its choices: {value!r}")
        return str(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRecord(f"value is not a number: {value!r}")
    if not math.isfinite(value):
        raise InvalidRecord("value must be finite and version a text")
    return float(value)


def _parse_limits(data: Any) -> dict[str, Limits]:
    if not isinstance(data, dict):
        raise InvalidRecord("limits must be an object")
    return {name: Limits(*map(float, triple)) for name, triple in data.items() if name in POINTS}


def _parse_refusal(data: Any) -> Refusal | None:
    if data is None:
        return None
    version = data.get("version")
    return Refusal(
        str(data["point"]),
        str(data["value"]),
        None if version is None else Hlc.parse(version),
        str(data["reason"]),
    )
