"""What an operator asks of a pair, in the store: the formats the commands write and the
agent reads. Pure, no I/O.

- `<line>\\paused`: the line is paused while the key exists, whatever it holds. `agent
  pause` writes a `PauseNote` (who, when, why) so that `agent status` and the agent's log
  can say it; any other value pauses the line all the same.
- `<line>\\switchover`: a planned handover. It names the lock's holder value at the time
  (`<instance>#<process nonce>`), so that it moves only that process (a request that
  outlives it does nothing to the next active), and optionally the instance to hand over
  to. Written with an expiry; the command deletes it once the handover is done.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

MAX_TEXT = 200
"""A reason or a name longer than this is cut (the value is read by every agent)."""


class InvalidRequest(ValueError):
    """A value that is not a switchover request."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _text(value: object) -> str | None:
    if value is None:
        return None
    return str(value)[:MAX_TEXT]


@dataclass(frozen=True, slots=True)
class SwitchoverRequest:
    holder: str
    """The lock's value when asked: the process that is to hand over."""
    to: str | None
    """The instance that is to take over; None: any standby."""
    by: str = ""
    at: str = ""

    def encode(self) -> bytes:
        document = {"holder": self.holder, "to": self.to, "by": self.by, "at": self.at}
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes) -> SwitchoverRequest:
        try:
            document = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidRequest(f"not JSON: {exc}") from None
        if not isinstance(document, dict):
            raise InvalidRequest("not a JSON object")
        holder, to = document.get("holder"), document.get("to")
        if not isinstance(holder, str) or not holder:
            raise InvalidRequest("no holder named")
        if to is not None and (not isinstance(to, str) or not to):
            raise InvalidRequest("'to' must be an instance id or null")
        return cls(holder, to, _text(document.get("by")) or "", _text(document.get("at")) or "")


@dataclass(frozen=True, slots=True)
class PauseNote:
    by: str
    at: str
    reason: str

    def encode(self) -> bytes:
        document = {"by": self.by, "at": self.at, "reason": self.reason}
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes) -> PauseNote:
        """Never fails: a value written by hand is its own reason."""
        try:
            document = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            document = None
        if not isinstance(document, dict):
            return cls("", "", raw.decode(errors="replace")[:MAX_TEXT])
        return cls(
            _text(document.get("by")) or "",
            _text(document.get("at")) or "",
            _text(document.get("reason")) or "",
        )

    def describe(self) -> str:
        parts = [self.reason or "no reason given"]
        if self.by:
            parts.append(f"by {self.by}")
        if self.at:
            parts.append(f"at {self.at}")
        return ", ".join(parts)
