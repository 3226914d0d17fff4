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
- A store that went back in time (a key older than the last sync: it lost writes it had
  acknowledged) holds no change: the unit's value is published again, and the unit keeps it.
- A unit back from an absence (it left the line: unplugged, reset, powered off, replaced)
  with a value other than the synced one holds no person's change the agent can tell from a
  factory value: its profile (or its line) says who wins, the store (its value is written
  back to the unit) or the unit (its value is published), and the agent says so.
- A value the agent wrote is never a panel change. Before it writes a remote change to the
  controller the agent records the write as pending (in its sync record too, so that a
  takeover knows it); a write whose answer never came (a timeout, a lost link, a takeover)
  stays pending until a later sync settles it. A controller that holds a pending value holds
  the agent's own write, synced at that write's version (`settled`), not a panel change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from agent.controller import points
from agent.controller.interface import Limits, PointValue
from agent.controller.points import SET_POINT, InvalidValue, Point
from agent.protocol.hlc import Hlc

InvalidRemoteValue = InvalidValue
"""The store holds something the point cannot take."""


@dataclass(frozen=True, slots=True)
class Deadband:
    """What a heating or cooling set point must keep from the other one: a heating set
    point stays below the cooling one by `least`, and the other way round."""

    other: str
    """The other set point's name (heatSetPoint, coolSetPoint)."""
    other_value: float | None
    """Its value: the unit's, or the one a change of its key in the same burst brings."""
    least: float

    def breaks(self, value: float) -> str | None:
        """Why `value` cannot stand beside the other set point, or None."""
        heat, cool = (
            (value, self.other_value) if self.other == "coolSetPoint" else (self.other_value, value)
        )
        return points.check_deadband(heat, cool, self.least)


@dataclass(frozen=True, slots=True)
class Rules:
    """What a remote value of one point must be: its kind (agent.controller.points), the
    unit's limits for a number, and for a heating or cooling set point the deadband it
    keeps from the other one."""

    point: Point = SET_POINT
    limits: Limits | None = None
    deadband: Deadband | None = None

    def valid(self, raw: bytes) -> tuple[PointValue, PointValue]:
        """(as sent, as the unit will keep it: rounded to its step) or InvalidValue."""
        sent = points.parse(self.point, raw)
        kept = points.validate(self.point, sent, self.limits)
        if self.deadband is not None:
            assert isinstance(kept, float)
            reason = self.deadband.breaks(kept)
            if reason is not None:
                raise InvalidValue(reason)
        return sent, kept


def as_rules(rules: Rules | Limits) -> Rules:
    return rules if isinstance(rules, Rules) else Rules(SET_POINT, rules)


@dataclass(frozen=True, slots=True)
class Synced:
    """The value both sides last agreed on, and its version in the store."""

    value: PointValue | None = None
    version: Hlc | None = None


@dataclass(frozen=True, slots=True)
class ApplyToController:
    value: PointValue
    version: Hlc
    # The store holds an unrounded value: write back what the controller keeps.
    correct_store: bool = False
    after_absence: str | None = None
    """Why the store's value goes back to a unit back from an absence (said as a warning)."""


@dataclass(frozen=True, slots=True)
class PublishToStore:
    value: PointValue
    reason: str
    only_if_absent: bool = False
    """The store held nothing: write only if it still holds nothing (SET NX), so that a
    remote change written meanwhile is applied rather than overwritten."""
    after_absence: bool = False
    """The unit's value after an absence, published by its profile's choice (a warning)."""


@dataclass(frozen=True, slots=True)
class Record:
    """Nothing to write: both sides already agree on `value` at `version`."""

    value: PointValue
    version: Hlc | None


@dataclass(frozen=True, slots=True)
class Ignore:
    reason: str


@dataclass(frozen=True, slots=True)
class Reject:
    """An invalid remote value: the controller is left alone, the store gets the unit's
    value back (`restore`, fenced), and the refusal is recorded with its reason."""

    reason: str
    value: bytes = b""
    """The value refused, as the store held it."""
    version: Hlc | None = None
    restore: PointValue | None = None
    """What the unit holds: written back to the key."""


Decision = ApplyToController | PublishToStore | Record | Ignore | Reject


def same(a: PointValue | None, b: PointValue | None) -> bool:
    return points.same(a, b)


def encode_setpoint(value: float) -> bytes:
    """ASCII decimal with at least one decimal place: 21.5, 22.0, 21.25."""
    return points.encode(SET_POINT, value)


def parse_setpoint(raw: bytes) -> float:
    value = points.parse(SET_POINT, raw)
    assert isinstance(value, float)
    return value


def on_remote_change(
    synced: Synced, raw: bytes, version: Hlc, controller: PointValue, rules: Rules | Limits
) -> Decision:
    """A SET notification for the point's key; `controller` was just read."""
    if synced.version is not None and version <= synced.version:
        return Ignore(f"version {version} is not newer than the synced {synced.version}")
    if synced.value is not None and not same(controller, synced.value):
        return PublishToStore(controller, "local change crossed a remote change")
    return _apply(raw, version, controller, as_rules(rules))


def _apply(raw: bytes, version: Hlc, controller: PointValue, rules: Rules) -> Decision:
    try:
        sent, kept = rules.valid(raw)
    except InvalidValue as exc:
        return Reject(str(exc), raw, version, controller)
    correct = not same(sent, kept)
    if same(kept, controller) and not correct:
        return Record(kept, version)
    return ApplyToController(kept, version, correct_store=correct)


def on_poll(synced: Synced, controller: PointValue) -> Decision:
    """The controller was read; a difference from the synced value is a local change."""
    if same(controller, synced.value):
        return Ignore("unchanged")
    return PublishToStore(controller, "local change")


def reconcile(
    synced: Synced,
    store_raw: bytes | None,
    store_version: Hlc | None,
    controller: PointValue,
    rules: Rules | Limits,
) -> Decision:
    """At startup, after a reconnect or a controller reopen: bring the three together."""
    rules = as_rules(rules)
    if store_raw is None:
        what = "set point" if rules.point is SET_POINT else rules.point.name
        return PublishToStore(controller, f"the store has no {what}", only_if_absent=True)
    if synced.value is None:  # first run: the store is the reference
        return _apply(store_raw, store_version or Hlc(0, 0, ""), controller, rules)
    local_changed = not same(controller, synced.value)
    remote_changed = store_version is not None and (
        synced.version is None or store_version > synced.version
    )
    if local_changed:
        why = "local change crossed a remote change" if remote_changed else "local change"
        return PublishToStore(controller, why + " while the agent was away")
    if remote_changed:
        assert store_version is not None
        return _apply(store_raw, store_version, controller, rules)
    if went_back(store_version, synced.version):
        return PublishToStore(
            controller,
            f"the store went back in time: it holds version {store_version}, older than the "
            f"synced {synced.version}",
        )
    return Ignore("in sync")


def after_absence(
    policy: str,
    synced: Synced,
    store_raw: bytes | None,
    store_version: Hlc | None,
    controller: PointValue,
    rules: Rules | Limits,
) -> Decision:
    """The first decision on a unit back from an absence, the store just read. A unit
    that holds the synced value (or a point never synced, or a key the store lacks) is
    reconciled as ever, and one found in sync is recorded so (its absence is over); one
    that holds another value gets the store's back (`policy` "store") or has its own
    published ("unit"), either way said as such."""
    rules = as_rules(rules)
    if synced.value is None or store_raw is None or same(controller, synced.value):
        decision = reconcile(synced, store_raw, store_version, controller, rules)
        if isinstance(decision, Ignore):  # in sync
            return Record(controller, synced.version)
        return decision

    if same(parsed(rules.point, store_raw), controller):
        return Record(controller, store_version)  # the store holds the unit's value already

    def shown(value: PointValue) -> str:
        return points.encode(rules.point, value).decode()

    back = f"back after an absence with {shown(controller)}, not the synced {shown(synced.value)}"
    if policy == "unit":
        why = f"{back}: the unit's value wins (after_absence unit)"
        return PublishToStore(controller, why, after_absence=True)
    decision = _apply(store_raw, store_version or Hlc(0, 0, ""), controller, rules)
    if isinstance(decision, ApplyToController):
        why = f"{back}: the store's {shown(decision.value)} goes back to it (after_absence store)"
        return replace(decision, after_absence=why)
    return decision  # the store's value is the unit's already, or one it cannot take


def absence_words(decision: Decision) -> str | None:
    """What a decision on a unit back from an absence says of it, or None (no such one)."""
    if isinstance(decision, ApplyToController):
        return decision.after_absence
    if isinstance(decision, PublishToStore) and decision.after_absence:
        return decision.reason
    return None


def went_back(store_version: Hlc | None, known: Hlc | None) -> bool:
    """The key holds a version older than one it is known to have had (synced, or seen): the
    store lost acknowledged writes (restored from a backup, a log that lost its tail). Its
    value is no change made by anyone, and must not be taken for one."""
    return store_version is not None and known is not None and store_version < known


def newest_held(held: Iterable[Synced]) -> Synced | None:
    """Of the values a key is known to have held (each with its version), the newest: what a
    store that went back in time is given back, so that no write it acknowledged and lost
    looks older than the stale value it holds."""
    complete = [s for s in held if s.value is not None and s.version is not None]
    return max(complete, key=lambda s: s.version or Hlc(0, 0, ""), default=None)


def base_after_a_lost_race(synced: Synced, read: PointValue) -> Synced:
    """The sync to compare with after the unit's value, published to an empty key only if
    it stayed empty, found it written meanwhile (a remote change): with nothing synced yet,
    the value just read, without a version. The next reconcile then tells a unit that
    still holds it (the remote change is applied) from one changed at its panel since (a
    local change crossed the remote one: published), where the first-run rule would take
    the store for the reference and write over the panel change."""
    return Synced(read, None) if synced.value is None else synced


MAX_PENDING = 4
"""Writes in doubt remembered per device (newest last); older ones are forgotten."""


def settled(synced: Synced, pending: Iterable[Synced], controller: PointValue) -> Synced:
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
    """The pending writes a sync at `synced` has not settled (newer than it): a set, oldest
    first, the newest MAX_PENDING kept. A write known twice (our own and the one a record
    read back names, as a takeover after a reload merges them) is one write: kept twice,
    it would push a distinct older one out, and the unit holding that one be taken for a
    panel change."""
    kept = {
        p: p.version
        for p in pending
        if p.version is not None and (synced.version is None or p.version > synced.version)
    }
    return tuple(sorted(kept, key=kept.__getitem__)[-MAX_PENDING:])


def newer(a: Synced, b: Synced) -> Synced:
    """The one of two syncs with the newer version (a versionless sync is the oldest); the
    second on a tie. Two values at one version: a takeover that took the former active's
    marked publish as synced kept the version it had (`takeover_base`). The second, a
    sync record, says what its writer made of it later than the first, this instance's
    own, knew."""
    if b.version is None or b.value is None:
        return a
    if a.version is None or a.value is None or b.version >= a.version:
        return b
    return a


def parsed(point: Point, raw: bytes | None) -> PointValue | None:
    """A key's value as the point's, None when absent or not one of its values."""
    if raw is None:
        return None
    try:
        return points.parse(point, raw)
    except InvalidValue:
        return None


def published_marker(
    published: PointValue | None,
    marked_at: Hlc | None,
    store_value: PointValue | None,
    store_version: Hlc | None,
    reached: bool | None = None,
) -> PointValue | None:
    """The record's `published` marker, if the store had that value before the record; None
    when it never did: the store refused the publish (a remote change with a newer token
    was there first) and the former active had no time to say so. Its controller's value
    is a panel change still to publish, not a value the store had.

    `reached`: what this instance saw of the key (`history.StoreHistory.reached_store`),
    which decides when it knows. Otherwise the store's value: one written before the record
    (`marked_at`, the record's version) that is not the marked one means a refusal. (A
    remote change landing between the value and the record, both sent at once on one
    connection, looks the same: taken for a refusal, the panel change is published over it.
    And a refused publish followed by a remote change after the record looks like an
    accepted one: the remote change is applied. Documented in design.md.)"""
    if published is None or reached is True:
        return published
    if reached is False:
        return None
    if marked_at is None or store_version is None:
        return published
    if store_version < marked_at and not same(store_value, published):
        return None
    return published


def takeover_base(
    own: Synced,
    record: Synced | None,
    seen: Iterable[Synced],
    controller: PointValue,
    published: PointValue | None = None,
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

    `published` is the value the record says the former active published right before it
    (sent after the value on the same connection): when the controller still holds it, the
    store had it before the record, so whatever the store holds now came after it, even if
    this instance never saw that value's version.
    """
    base = own if record is None else newer(own, record)
    complete = [(s.version, s.value) for s in seen if s.version is not None and s.value is not None]
    for version, value in sorted(complete, key=lambda pair: pair[0]):
        if (base.version is None or version > base.version) and same(value, controller):
            base = Synced(value, version)
    if published is not None and same(controller, published) and not same(base.value, published):
        base = Synced(published, base.version)
    return base
