"""What to do when the set point changes on one side: pure functions, no I/O.

The store orders changes. The agent remembers the value and store version it last synced
(`Synced`), and every event is judged against it:

- A remote change not newer than the last synced version is ignored: that covers the
  echo of the agent's own writes and notifications that arrive late.
- A local change (the controller differs from the last synced value) is written to the
  store, which gives it a version.
- Crossing changes: a change counts from the moment it reaches the store. A remote
  change reaches it when its writer sets it; a local change when the agent notices it,
  at the next poll or just before applying a remote change (the controller is read
  first). So when the agent is about to apply a remote change and finds an unsynced
  local change, the local change is written to the store after the remote one, and
  wins on both sides. Whichever reached the store last is what both sides end with.
- A value the agent wrote is never a panel change. Before it writes a remote change to the
  controller the agent records the write as pending (in its sync record too, so that a
  takeover knows it); a write whose answer never came (a timeout, a lost link, a takeover)
  stays pending until a later sync settles it. A controller that holds a pending value holds
  the agent's own write, synced at that write's version (`settled`), not a panel change.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from agent.controller.interface import InvalidSetpoint, Limits, validate_setpoint
from agent.protocol.hlc import Hlc

_DECIMAL = re.compile(rb"-?[0-9]{1,4}(\.[0-9]{1,6})?")
_TOLERANCE = 1e-6


class InvalidRemoteValue(ValueError):
    """The store holds something that is not a usable set point."""


@dataclass(frozen=True, slots=True)
class Synced:
    """The value both sides last agreed on, and its version in the store."""

    value: float | None = None
    version: Hlc | None = None


@dataclass(frozen=True, slots=True)
class ApplyToController:
    value: float
    version: Hlc
    # The store holds an unrounded value: write back what the controller keeps.
    correct_store: bool = False


@dataclass(frozen=True, slots=True)
class PublishToStore:
    value: float
    reason: str
    only_if_absent: bool = False
    """The store held nothing: write only if it still holds nothing (SET NX), so that a
    remote change written meanwhile is applied rather than overwritten."""


@dataclass(frozen=True, slots=True)
class Record:
    """Nothing to write: both sides already agree on `value` at `version`."""

    value: float
    version: Hlc | None


@dataclass(frozen=True, slots=True)
class Ignore:
    reason: str


@dataclass(frozen=True, slots=True)
class Reject:
    """An invalid remote value: logged and counted, the controller is left alone."""

    reason: str


Decision = ApplyToController | PublishToStore | Record | Ignore | Reject


def same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, abs_tol=_TOLERANCE)


def encode_setpoint(value: float) -> bytes:
    """ASCII decimal with at least one decimal place: 21.5, 22.0, 21.25."""
    text = f"{value:.3f}".rstrip("0")
    return (text + "0" if text.endswith(".") else text).encode()


def parse_setpoint(raw: bytes) -> float:
    if not _DECIMAL.fullmatch(raw):
        shown = raw[:32].decode("ascii", errors="backslashreplace")
        raise InvalidRemoteValue(f"not a decimal number: {shown!r}")
    return float(raw)


def _valid(raw: bytes, limits: Limits) -> tuple[float, float]:
    """(as sent, rounded to the controller's step) or InvalidRemoteValue."""
    parsed = parse_setpoint(raw)
    try:
        return parsed, validate_setpoint(parsed, limits)
    except InvalidSetpoint as exc:
        raise InvalidRemoteValue(str(exc)) from None


def on_remote_change(
    synced: Synced, raw: bytes, version: Hlc, controller: float, limits: Limits
) -> Decision:
    """A SET notification for the set point key; `controller` was just read."""
    if synced.version is not None and version <= synced.version:
        return Ignore(f"version {version} is not newer than the synced {synced.version}")
    if synced.value is not None and not same(controller, synced.value):
        return PublishToStore(controller, "local change crossed a remote change")
    return _apply(raw, version, controller, limits)


def _apply(raw: bytes, version: Hlc, controller: float, limits: Limits) -> Decision:
    try:
        sent, rounded = _valid(raw, limits)
    except InvalidRemoteValue as exc:
        return Reject(str(exc))
    correct = not same(sent, rounded)
    if same(rounded, controller) and not correct:
        return Record(rounded, version)
    return ApplyToController(rounded, version, correct_store=correct)


def on_poll(synced: Synced, controller: float) -> Decision:
    """The controller was read; a difference from the synced value is a local change."""
    if same(controller, synced.value):
        return Ignore("unchanged")
    return PublishToStore(controller, "local change")


def reconcile(
    synced: Synced,
    store_raw: bytes | None,
    store_version: Hlc | None,
    controller: float,
    limits: Limits,
) -> Decision:
    """At startup, after a reconnect or a controller reopen: bring the three together."""
    if store_raw is None:
        return PublishToStore(controller, "the store has no set point", only_if_absent=True)
    if synced.value is None:  # first run: the store is the reference
        return _apply(store_raw, store_version or Hlc(0, 0, ""), controller, limits)
    local_changed = not same(controller, synced.value)
    remote_changed = store_version is not None and (
        synced.version is None or store_version > synced.version
    )
    if local_changed:
        why = "local change crossed a remote change" if remote_changed else "local change"
        return PublishToStore(controller, why + " while the agent was away")
    if remote_changed:
        assert store_version is not None
        return _apply(store_raw, store_version, controller, limits)
    return Ignore("in sync")


MAX_PENDING = 4
"""Writes in doubt remembered per device (newest last); older ones are forgotten."""


def settled(synced: Synced, pending: Iterable[Synced], controller: float) -> Synced:
    """What the controller holds, as a sync: `synced` if it holds that value; the newest
    write of ours still pending (issued, never confirmed) that it holds, newer than
    `synced`; else `synced` (and the controller holds a panel change)."""
    if same(controller, synced.value):
        return synced
    found = synced
    for write in pending:
        if write.value is None or write.version is None:
            continue
        if not same(write.value, controller):
            continue
        if found.version is None or write.version > found.version:
            found = write
    return found


def still_pending(pending: Iterable[Synced], synced: Synced) -> tuple[Synced, ...]:
    """The pending writes a sync at `synced` has not settled (newer than it), bounded."""
    kept = [
        p
        for p in pending
        if p.version is not None and (synced.version is None or p.version > synced.version)
    ]
    return tuple(kept[-MAX_PENDING:])


def newer(a: Synced, b: Synced) -> Synced:
    """The one of two syncs with the newer version (a versionless sync is the oldest)."""
    if b.version is None or b.value is None:
        return a
    if a.version is None or a.value is None or b.version > a.version:
        return b
    return a


def takeover_base(
    own: Synced, record: Synced | None, seen: Iterable[Synced], controller: float
) -> Synced:
    """What the former active last had on the controller, for the one taking over.

    `own` is this instance's last synced state, `record` the sync record in the store (the
    former active writes it after every sync, so it can lag one step behind: the former
    active may have died between a sync and its record), and `seen` the set point's values
    and versions this instance saw in the store while standby. A value the controller holds
    that reached the store after the record was written closes that gap: the controller was
    synced at that version. With the base, `reconcile` then tells a panel change the former
    active missed (the controller differs from the base) from a remote change it never
    applied (the store is newer than the base), and applies the crossing rule when both.
    (A panel change to exactly the value of such a store change is taken for it.)
    """
    base = own if record is None else newer(own, record)
    complete = [(s.version, s.value) for s in seen if s.version is not None and s.value is not None]
    for version, value in sorted(complete, key=lambda pair: pair[0]):
        if (base.version is None or version > base.version) and same(value, controller):
            base = Synced(value, version)
    return base
