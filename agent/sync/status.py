"""What a point's sync shows of itself: its last synced state, its controller's state, the
writes it has in doubt and its error counters (read by status, health and telemetry)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.controller.interface import ControllerError, ControllerFault, ControllerUnavailable
from agent.sync.decisions import Synced


@dataclass
class SyncCounters:
    invalid_remote_values: int = 0
    controller_errors: int = 0
    store_errors: int = 0
    fenced_writes_rejected: int = 0
    not_authorized: int = 0


@dataclass
class SyncStatus:
    synced: Synced = field(default_factory=Synced)
    synced_at: float | None = None  # wall clock, seconds
    controller: str = "ok"  # ok | unavailable | error
    counters: SyncCounters = field(default_factory=SyncCounters)
    pending: tuple[Synced, ...] = ()
    """Remote changes written (or about to be) to the controller, not yet confirmed."""

    def controller_fault(self, exc: ControllerFault) -> None:
        """Counts a controller's fault, and shows it."""
        if isinstance(exc, ControllerUnavailable):
            self.controller = "unavailable"
        elif isinstance(exc, ControllerError):
            self.controller = "error"
        self.counters.controller_errors += 1
