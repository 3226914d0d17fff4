"""The sync record: what the active last had on a controller, kept in the store.

The active writes it (fenced) after every sync, to `<device>\\synced`, so that whoever
takes over can tell a panel change the former active had not published from a remote change
it had not applied (see `decisions.takeover_base`). Pure: encoding and parsing only.

The value is compact JSON: `{"value":21.5,"version":"001700000000000:00003:statestore"}`,
where version is the set point key's version at that sync.
"""

from __future__ import annotations

import json
import math

from agent.protocol.hlc import Hlc, HlcError
from agent.sync.decisions import Synced

MAX_RECORD_BYTES = 256


class InvalidRecord(ValueError):
    """The store holds something that is not a sync record."""


def encode_record(synced: Synced) -> bytes:
    if synced.value is None or synced.version is None:
        raise ValueError("only a complete sync (value and version) is recorded")
    data = {"value": synced.value, "version": str(synced.version)}
    return json.dumps(data, separators=(",", ":")).encode()


def parse_record(raw: bytes) -> Synced:
    if len(raw) > MAX_RECORD_BYTES:
        raise InvalidRecord(f"a record of {len(raw)} bytes is too long")
    try:
        data = json.loads(raw)
        value, version = data["value"], data["version"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRecord(f"value is not a number: {value!r}")
        if not math.isfinite(value) or not isinstance(version, str):
            raise InvalidRecord("value must be finite and version a text")
        return Synced(float(value), Hlc.parse(version))
    except InvalidRecord:
        raise
    except (ValueError, TypeError, KeyError, HlcError, RecursionError) as exc:
        shown = raw[:64].decode("utf-8", errors="backslashreplace")
        raise InvalidRecord(f"not a sync record: {shown!r} ({exc})") from None
