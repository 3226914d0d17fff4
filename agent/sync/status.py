"""What a point's sync shows of itself: its last synced state, its controller's state, the
writes it has in doubt and its error counters (read by status, health and telemetry)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agent.controller.interface import ControllerError, ControllerFault, ControllerUnavailable
from agent.protocol.hlc import Hlc
from agent.sync.decisions import Synced
from agent.tally import Tally

# A write of a point, as counted: where the value came from (a remote change to the
# controller; the unit's value to the store: a panel change, a rounded value; the unit's
# value back to the store after a refusal) and how it ended.
REMOTE, PANEL, RESTORE = "remote", "panel", "restore"
APPLIED, REFUSED, NOT_CONFIRMED, NOT_SENT = "applied", "refused", "not_confirmed", "not_sent"
# Where a point's last change came from (its change source, as `agent status` shows it).
FROM_PANEL, FROM_REMOTE = "panel", "remote"
RESTORED_AFTER_REFUSAL = "restored after a refusal"
RESTORED_AFTER_ABSENCE = "restored after an absence"
UNITS_AFTER_ABSENCE = "the unit's after an absence"
READ_BACK_BOUNDS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""From a remote change (its version's time) to the controller's read-back."""


@dataclass
class SyncCounters:
    invalid_remote_values: int = 0
    controller_errors: int = 0
    store_errors: int = 0
    fenced_writes_rejected: int = 0
    not_authorized: int = 0
    writes: Tally = field(default_factory=lambda: Tally(READ_BACK_BOUNDS_S))
    """Writes by (origin, result); a remote change applied, its time to the read-back."""


@dataclass(frozen=True, slots=True)
class LastChange:
    """A point's last change: where it came from, when (wall clock, s), its store version."""

    source: str
    at: float
    version: Hlc | None


@dataclass
class SyncStatus:
    synced: Synced = field(default_factory=Synced)
    synced_at: float | None = None  # wall clock, seconds
    controller: str = "ok"  # ok | unavailable | error
    counters: SyncCounters = field(default_factory=SyncCounters)
    pending: tuple[Synced, ...] = ()
    """Remote changes written (or about to be) to the controller, not yet confirmed."""
    change: LastChange | None = None
    """The point's last change this process made on either side, and its source."""

    def changed(self, source: str, version: Hlc | None) -> None:
        self.change = LastChange(source, time.time(), version)

    def wrote(self, origin: str, result: str, *, changed_ms: int | None = None) -> None:
        """Counts a write; with `changed_ms` (the remote change's version: the store's clock
        when it was made), its time from the remote writer to the unit's read-back."""
        self.counters.writes.count((origin, result))
        if changed_ms is not None:
            self.counters.writes.observe((origin,), max(0.0, time.time() - changed_ms / 1000))

    def controller_fault(self, exc: ControllerFault) -> None:
        """Counts a controller's fault, and shows it."""
        if isinstance(exc, ControllerUnavailable):
            self.controller = "unavailable"
        elif isinstance(exc, ControllerError):
            self.controller = "error"
        self.counters.controller_errors += 1
