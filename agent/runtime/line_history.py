"""What an instance records in its line's history (agent.ops.history) and says in its log:
a takeover naming the former holder and why, a switchover, a pause, a resume, a step-down.

The former holder is the last other holder seen on the lock (its renewals come as
notifications); why its lease ended is told by when the lock went: deleted within a lease
of its last renewal, it was released; later, the store expired it (the holder stopped
renewing: killed, frozen, cut off). Records are written in the background (never holding
up a takeover) and best effort (agent.ops.history_store).

Every record is written under the lease it is fenced with, and only while that lease is
held: a step-down comes once the lease is over (lost, refused, run out), so it is kept and
written ahead of this instance's next record under a lease (its next takeover); meanwhile
the new active's takeover says why the lease ended.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agent.client.lock import holder_instance, process_holder
from agent.client.statestore import KeyChange, StateStoreClient
from agent.ops.control import PauseNote, SwitchoverRequest, now_iso
from agent.ops.history import Entry
from agent.ops.history_store import HistoryWriter
from agent.protocol.hlc import Hlc
from agent.runtime.control import LineControl

if TYPE_CHECKING:
    from agent.config import AgentSettings

log = logging.getLogger("agent")

EXPIRED_AFTER = 0.8
"""Deleted this many TTLs or more after its last renewal, a lease expired (a holder
renews every third of one, and releases at once)."""


def takeover(
    former: str | None,
    renewed_ms: int | None,
    deleted_at: float | None,
    ttl_s: float,
    request: SwitchoverRequest | None,
) -> tuple[str, str]:
    """The event and why, for a takeover from `former` (None: nobody seen holding it),
    whose last renewal the store stamped `renewed_ms` and whose lock was seen deleted at
    `deleted_at` (wall clock, s)."""
    if request is not None and former is not None and holder_instance(request.holder) == former:
        return "switchover", f"requested by {request.by or '?'}" + (
            f" at {request.at}" if request.at else ""
        )
    if former is None:
        return "takeover", "nobody held the lock"
    if deleted_at is None or renewed_ms is None:
        return "takeover", f"the lease of {former} ended"
    silent = deleted_at - renewed_ms / 1000
    if silent >= EXPIRED_AFTER * ttl_s:
        return "takeover", (
            f"the lease of {former} expired {silent:.1f} s after its last renewal "
            "(killed, frozen or cut off from the store)"
        )
    return "takeover", f"{former} released the lock"


class LineHistory:
    def __init__(
        self,
        settings: AgentSettings,
        process: str,
        client: Callable[[], StateStoreClient | None],
        control: Callable[[], LineControl | None],
        spawn: Callable[[Awaitable[Any]], asyncio.Future[Any]],
        leased: Callable[[], bool],
    ) -> None:
        """`process`: this process's nonce (in its holder value); `client` and `control`:
        the agent's, once it has them; `leased()`: this instance drives under its lease
        (a record is written only then)."""
        self._client = client
        self.key = settings.keys.of_line("history", settings.line.id)
        self.instance = settings.instance_id
        self._holder = process_holder(self.instance, process).encode()
        self.ttl_s = settings.lock.ttl_ms / 1000
        self._spawn = spawn
        self._writer: HistoryWriter | None = None
        self._former: str | None = None
        self._renewed_ms: int | None = None
        self._deleted_at: float | None = None
        self._control = control
        self._requested: SwitchoverRequest | None = None
        """The request when the lock went: withdrawn by the time the next active
        records its takeover, it still says why."""
        self._leased = leased
        self._stepped_down: Entry | None = None
        """A step-down not recorded yet: written ahead of the next record under a lease."""
        self._handing_over = False

    def saw_lock(self, change: KeyChange) -> None:
        """Every change of the lock, as the instance sees it."""
        if change.kind == "SET" and change.value not in (None, self._holder):
            assert change.value is not None
            self._former = holder_instance(change.value)
            self._renewed_ms = None if change.version is None else change.version.wall_ms
            self._deleted_at = None
        elif change.kind == "DELETE" and not change.synthetic:
            self._deleted_at = time.time()
            self._requested = self._request()

    def _request(self) -> SwitchoverRequest | None:
        """The switchover request in the store now (agent.runtime.control)."""
        control = self._control()
        return None if control is None else control.request

    def took_over(self, token: Hlc | None) -> None:
        former, request = self._former, self._request() or self._requested
        event, why = takeover(former, self._renewed_ms, self._deleted_at, self.ttl_s, request)
        named = (
            f"{former} (a former process of this instance)" if former == self.instance else former
        )
        how = " by switchover" if event == "switchover" else ""
        log.info("taking over%s: %s", f" from {named}{how}" if named else "", why)
        self._record(token, event, former or "", self.instance, why)
        self._former = self._renewed_ms = self._deleted_at = self._requested = None
        self._handing_over = False

    def handing_over(self) -> None:
        """A switchover: the next active records it, not this step-down."""
        self._handing_over = True

    def stepped_down(self, reason: str) -> None:
        """Kept, not written: the lease it would be fenced with is over."""
        if not self._handing_over:
            self._stepped_down = Entry(now_iso(), "step-down", self.instance, "", reason)

    def paused(self, token: Hlc | None, note: PauseNote) -> None:
        self._record(token, "pause", self.instance, "", note.describe())

    def resumed(self, token: Hlc | None) -> None:
        self._record(token, "resume", "", self.instance, "resumed: reconciling every device")

    def device_event(self, device: str, event: str, words: str, token: Hlc | None) -> None:
        """A device's event the history keeps, under the lease `token`: "unit back" (from an
        absence with other values, and what was done: agent.sync.decisions.after_absence),
        "refused" (a remote value the unit cannot take; the store got its value back)."""
        self._record(token, event, device, "", words)

    def _record(self, token: Hlc | None, event: str, source: str, to: str, why: str) -> None:
        client = self._client()
        if token is None or client is None:
            return
        if self._writer is None:
            self._writer = HistoryWriter(client, self.key)
        entries = [e for e in (self._stepped_down,) if e is not None]
        entries.append(Entry(now_iso(), event, source, to, why))
        self._stepped_down = None
        self._spawn(self._writer.record(token, *entries, leased=self._leased))
