"""A line's history in the store (`<line>\\history`), pure: what happened to the pair and
why, as `patronictl history` tells a cluster's. Entries are JSON objects, oldest first:

- `time`: when, ISO 8601 UTC (the writer's clock);
- `event`: `takeover`, `switchover`, `step-down`, `pause` or `resume`;
- `from`, `to`: the instances it moved the line from and to (empty where none: a first
  takeover has no `from`, a step-down no `to`; a pause is from the active, a resume to it);
- `why`: the reason, in words.

The value is bounded (the newest MAX_ENTRIES entries within MAX_BYTES, each text cut to
MAX_TEXT), so that it never grows with the pair's age. A value that is not a history is an
InvalidHistory, never another exception.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_ENTRIES = 100
MAX_BYTES = 8192
MAX_TEXT = 160
EVENTS = ("takeover", "switchover", "step-down", "pause", "resume")


class InvalidHistory(ValueError):
    """A value that is not a line's history."""


def _text(value: object, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidHistory(f"an entry's {name} is not text")
    return value[:MAX_TEXT]


@dataclass(frozen=True, slots=True)
class Entry:
    time: str
    event: str
    source: str
    """The instance the line moved from ("from")."""
    to: str
    why: str

    def document(self) -> dict[str, str]:
        return {
            "time": self.time[:MAX_TEXT],
            "event": self.event[:MAX_TEXT],
            "from": self.source[:MAX_TEXT],
            "to": self.to[:MAX_TEXT],
            "why": self.why[:MAX_TEXT],
        }

    @classmethod
    def from_document(cls, document: object) -> Entry:
        if not isinstance(document, dict):
            raise InvalidHistory("an entry is not a JSON object")
        return cls(
            _text(document.get("time"), "time"),
            _text(document.get("event"), "event"),
            _text(document.get("from"), "from"),
            _text(document.get("to"), "to"),
            _text(document.get("why"), "why"),
        )


def parse(raw: bytes) -> list[Entry]:
    """The entries of a stored history, oldest first; InvalidHistory for anything else."""
    try:
        document: Any = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InvalidHistory(f"not JSON: {exc}") from None
    if not isinstance(document, list):
        raise InvalidHistory("not a JSON array of entries")
    return [Entry.from_document(item) for item in document]


def encode(entries: list[Entry]) -> bytes:
    """The newest entries that fit the bounds, oldest first."""
    kept: list[bytes] = []
    size = 2  # the brackets
    for entry in reversed(entries[-MAX_ENTRIES:]):
        item = json.dumps(entry.document(), separators=(",", ":")).encode()
        if size + len(item) + 1 > MAX_BYTES:
            break
        kept.append(item)
        size += len(item) + 1
    return b"[" + b",".join(reversed(kept)) + b"]"


def append(raw: bytes | None, entry: Entry) -> bytes:
    """The stored history with `entry` added; one that cannot be read is started afresh
    (a history is a courtesy to the operator, never a reason to stop recording)."""
    try:
        entries = [] if raw is None else parse(raw)
    except InvalidHistory:
        entries = []
    return encode([*entries, entry])
