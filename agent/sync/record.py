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
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from agent.protocol.hlc import Hlc, HlcError
from agent.sync.decisions import MAX_PENDING, Synced

MAX_RECORD_BYTES = 1024


class InvalidRecord(ValueError):
    """The store holds something that is not a sync record."""


@dataclass(frozen=True, slots=True)
class SyncRecord:
    synced: Synced
    pending: tuple[Synced, ...] = ()
    """Writes to the controller issued and not confirmed, oldest first."""


def encode_record(synced: Synced, pending: tuple[Synced, ...] = ()) -> bytes:
    if synced.value is None or synced.version is None:
        raise ValueError("only a complete sync (value and version) is recorded")
    data: dict[str, Any] = {"value": synced.value, "version": str(synced.version)}
    if pending:
        data["pending"] = [_entry(write) for write in pending[-MAX_PENDING:]]
    return json.dumps(data, separators=(",", ":")).encode()


def _entry(synced: Synced) -> dict[str, Any]:
    if synced.value is None or synced.version is None:
        raise ValueError("only a complete write (value and version) is pending")
    return {"value": synced.value, "version": str(synced.version)}


def parse_record(raw: bytes) -> Synced:
    """The sync the record holds (see `parse_full_record` for its pending writes too)."""
    return parse_full_record(raw).synced


def parse_full_record(raw: bytes) -> SyncRecord:
    if len(raw) > MAX_RECORD_BYTES:
        raise InvalidRecord(f"a record of {len(raw)} bytes is too long")
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise InvalidRecord("not a JSON object")
        pending = data.get("pending", [])
        if not isinstance(pending, list) or len(pending) > MAX_PENDING:
            raise InvalidRecord(f"pending must be a list of at most {MAX_PENDING} writes")
        return SyncRecord(_parse_entry(data), tuple(_parse_entry(entry) for entry in pending))
    except InvalidRecord:
        raise
    except (ValueError, TypeError, KeyError, HlcError, RecursionError, AttributeError) as exc:
        shown = raw[:64].decode("utf-8", errors="backslashreplace")
        raise InvalidRecord(f"not a sync record: {shown!r} ({exc})") from None


def _parse_entry(data: Any) -> Synced:
    value, version = data["value"], data["version"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRecord(f"value is not a number: {value!r}")
    if not math.isfinite(value) or not isinstance(version, str):
        raise InvalidRecord("value must be finite and version a text")
    return Synced(float(value), Hlc.parse(version))
