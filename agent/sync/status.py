"""What a point's sync shows of itself: its last synced state, its controller's state, the
writes it has in doubt and its error counters (read by status, health and telemetry)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
