"""Taking over a device: what the former active last had on the controller, and what the
new active then does. Pure; the failover itself is simulated step by step."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent.controller.interface import Limits
from agent.controller.points import MODE
from agent.protocol.hlc import Hlc
from agent.sync.decisions import (
    ApplyToController,
    Decision,
    Ignore,
    PublishToStore,
    Record,
    Rules,
    Synced,
    encode_setpoint,
    published_marker,
    reconcile,
    takeover_base,
)
from agent.sync.history import StoreHistory
from agent.sync.record import (
    InvalidRecord,
    SyncRecord,
    encode_record,
    parse_full_record,
    parse_record,
)
from tests.support.examples import examples

LIMITS = Limits(5.0, 35.0, 0.5)


def v(n: int) -> Hlc:
    return Hlc(1_700_000_000_000 + n, 0, "statestore")


def test_record_round_trip() -> None:
    synced = Synced(21.5, v(3))
    raw = encode_record(synced)
    assert raw == b'{"value":21.5,"version":"' + str(v(3)).encode() + b'"}'
    assert parse_record(raw) == synced


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"21.5",
        b"{}",
        b'{"value":"x","version":"1:0:a"}',
        b'{"value":1e999,"version":"1:0:a"}',
        b'{"value":true,"version":"1:0:a"}',
        b'{"value":1,"version":"nope"}',
        b"[" * 10_000,
        b"\xff\xfe",
        b'{"value":1,"version":"1:0:a"}' + b" " * 4100,
        b'{"value":1,"version":"1:0:a","pending":{}}',
        b'{"value":1,"version":"1:0:a","pending":[{"value":2}]}',
        b'{"value":1,"version":"1:0:a","pending":['
        + b'{"value":2,"version":"1:0:a"},' * 4
        + b'{"value":2,"version":"1:0:a"}]}',
    ],
)
def test_records_that_are_not_records(raw: bytes) -> None:
    with pytest.raises(InvalidRecord):
        parse_record(raw)


def test_a_record_with_writes_pending_round_trips() -> None:
    synced, pending = Synced(21.5, v(3)), (Synced(22.0, v(4)), Synced(23.0, v(5)))
    raw = encode_record(synced, pending)
    assert parse_full_record(raw) == SyncRecord(synced, pending)
    assert parse_record(raw) == synced  # a reader of the set point alone sees no change


@given(st.binary(max_size=300))
def test_any_bytes_parse_or_raise_invalid_record(raw: bytes) -> None:
    with contextlib.suppress(InvalidRecord):
        parse_record(raw)


def test_the_newer_of_own_state_and_record_is_the_base() -> None:
    own, record = Synced(20.0, v(1)), Synced(21.0, v(2))
    assert takeover_base(own, record, [], 21.0) == record
    assert takeover_base(record, own, [], 21.0) == record
    assert takeover_base(Synced(), None, [], 21.0) == Synced()


def test_a_value_the_controller_holds_that_reached_the_store_after_the_record() -> None:
    # The former active applied 22 (version 2) and died before recording it; then 23 came.
    record = Synced(20.0, v(1))
    seen = [Synced(22.0, v(2)), Synced(23.0, v(3))]
    base = takeover_base(record, record, seen, controller=22.0)
    assert base == Synced(22.0, v(2))
    decision = reconcile(base, b"23.0", v(3), 22.0, LIMITS)
    assert decision == ApplyToController(23.0, v(3))


def test_seen_values_older_than_the_record_do_not_count() -> None:
    record = Synced(20.0, v(5))
    assert takeover_base(Synced(), record, [Synced(22.0, v(2))], 22.0) == record


def test_the_record_wins_over_our_own_sync_at_the_same_version() -> None:
    """The 30-minute soak's lost mode: this instance, active before, had taken the former
    active's marked publish (heat) as synced at the version it had; the next active did the
    same with its own marked publish (auto), at that same version. Taking over again with
    heat at the panel (turned there meanwhile), our own heat won the tie, and the panel
    change passed for no change: the store's later remote change was applied over it."""
    own, record = Synced("heat", v(5)), Synced("auto", v(5))
    base = takeover_base(own, record, [], "heat")
    assert base == record
    decision = reconcile(base, b"cool", v(7), "heat", Rules(MODE))
    assert isinstance(decision, PublishToStore) and decision.value == "heat"


# ------------------------------------------------------------------ a simulated failover

REMOTE_VALUES = st.integers(10, 30).map(float)  # whole degrees
PANEL_VALUES = st.integers(10, 29).map(lambda n: n + 0.5)  # never equal to a remote value


@dataclass
class World:
    """The store, the controller, and the former active, which may die between any two
    of its writes (the controller, the store, the record)."""

    store: list[Synced] = field(default_factory=lambda: [Synced(20.0, v(0))])
    controller: float = 20.0
    synced: Synced = field(default_factory=lambda: Synced(20.0, v(0)))
    record: Synced = field(default_factory=lambda: Synced(20.0, v(0)))
    pending: tuple[Synced, ...] = ()  # the writes the record names as pending
    unrecorded_publish: bool = False  # died between publishing a panel change and its record
    published: float | None = None  # the record's marker: published right before the record
    published_after: Hlc | None = None  # beside it: the token the publish went out with
    record_version: Hlc = field(default_factory=lambda: v(0))
    clock: int = 1  # the store's versions, one sequence for the key and the record
    refused_publish: bool = False  # its publish refused (a newer token), then it died
    agent_view: float = 20.0  # what the former active last put on or read from the controller

    @property
    def panel_pending(self) -> bool:
        """A panel change the former active has not published. (A knob turned away and back
        between two polls is no change: nobody could have seen it.)"""
        return self.controller != self.agent_view

    def next_version(self) -> Hlc:
        self.clock += 1
        return v(self.clock)

    def write_record(self) -> None:
        self.record_version = self.next_version()

    def remote_set(self, value: float) -> None:
        self.store.append(Synced(value, self.next_version()))

    def panel(self, value: float) -> None:
        self.controller = value

    def play(self, steps: list[tuple[str, float]]) -> None:
        """Remote changes, panel changes and steps of the former active, until it dies."""
        for kind, value in steps:
            if kind == "remote":
                self.remote_set(value)
            elif kind == "panel":
                self.panel(value)
            elif not self.active_step(int(value)):
                return

    def active_step(self, die_after: int) -> bool:
        """One sync of the former active; False if it died during it."""
        latest = self.store[-1]
        if self.controller != self.agent_view:  # a local change: published first
            # The value and a record marked with it are sent at once, in that order; the
            # active may die before the value's version comes back to be recorded (1), or
            # be cut off between the two (2). With a remote change in the store it has not
            # applied yet, the store may refuse the value (that change carried a token of a
            # renewal the active had not heard of) and the active die before it can say so
            # (4): the record is marked all the same.
            token = v(self.clock)  # a renewal's version, older than the publish's
            if die_after == 4 and latest.version != self.synced.version:
                self.published, self.published_after = self.controller, token
                self.pending = ()
                self.write_record()
                self.refused_publish = True
                return False
            self.store.append(Synced(self.controller, self.next_version()))
            self.agent_view = self.controller
            if die_after == 1:
                self.published, self.published_after = self.controller, token
                self.pending = ()
                self.write_record()
                return False
            if die_after == 2:
                self.unrecorded_publish = True
                return False
            self.synced = self.record = self.store[-1]
            self.published = None
            self.write_record()
            return True
        if latest.version != self.synced.version:  # a remote change: applied
            assert latest.value is not None
            # Recorded as pending first (the record in the store), then written.
            self.pending = (*self.pending, latest)
            self.published = None
            self.write_record()
            if die_after == 2:
                return False
            self.controller = self.agent_view = latest.value
            if die_after == 1:
                return False
            self.synced = self.record = latest
            self.pending = ()
            self.write_record()
        return True

    def marker(self, seen: list[Synced], whole_since: Hlc) -> float | None:
        """The record's marker as the one taking over weighs it: against what it saw of the
        key (`seen`, every change since `whole_since`), then against the store."""
        latest = self.store[-1]
        history = StoreHistory()
        for change in seen:
            history.saw(change.value, change.version)
        reached = None
        if self.published is not None:
            reached = history.reached_store(
                self.published, self.published_after, self.record_version, whole_since
            )
        found = published_marker(
            self.published, self.record_version, latest.value, latest.version, reached
        )
        return None if found is None else float(found)


step = st.one_of(
    st.tuples(st.just("remote"), REMOTE_VALUES),
    st.tuples(st.just("panel"), PANEL_VALUES),
    st.tuples(st.just("active"), st.integers(0, 4)),  # 1, 2, 4: dies in the middle of this step
)


def outcome(decision: Decision, controller: float) -> float:
    if isinstance(decision, PublishToStore | ApplyToController | Record):
        return decision.value
    assert isinstance(decision, Ignore), decision
    return controller


@pytest.mark.thorough
@settings(max_examples=examples(1000, 150), deadline=None)
@given(st.lists(step, max_size=12), st.lists(step.filter(lambda s: s[0] != "active"), max_size=4))
def test_no_change_is_lost_across_a_failover(
    before: list[tuple[str, float]], during: list[tuple[str, float]]
) -> None:
    # Each panel change to a value of its own: a knob turned back to exactly a value that
    # was synced before cannot be told from a write the controller never got (documented).
    panel_values = [value for kind, value in before + during if kind == "panel"]
    assume(len(panel_values) == len(set(panel_values)))
    world = World()
    world.play(before)
    # The active is gone (killed, cut off, paused); changes keep coming until the takeover.
    world.play(during)
    latest = world.store[-1]
    assert latest.value is not None
    # The standby watched the key all along: it saw whether the store took the marked publish.
    marker = world.marker(world.store, v(0))
    base = takeover_base(world.record, world.record, world.store, world.controller, marker)
    decision = reconcile(
        base, encode_setpoint(latest.value), latest.version, world.controller, LIMITS
    )
    final = outcome(decision, world.controller)
    # The documented rule: a panel change that never reached the store wins (it reaches the
    # store last, published by the new active); otherwise the store's latest change does.
    expected = world.controller if world.panel_pending else latest.value
    assert final == expected, (decision, world)


@pytest.mark.thorough
@settings(max_examples=examples(2000, 200), deadline=None)
@given(
    st.lists(step, max_size=12),
    st.lists(step.filter(lambda s: s[0] != "active"), max_size=4),
    st.booleans(),
)
def test_no_change_is_lost_when_the_standby_was_away(
    before: list[tuple[str, float]], during: list[tuple[str, float]], away: bool
) -> None:
    """The standby was off the store while the former active applied remote changes (it
    saw only the store's latest value when it came back): the pending writes in the sync
    record tell the former active's writes from panel changes.

    A panel change the former active published and could not record the version of is
    told by the record's marker, written right after the value. One case stays open, and
    is documented: the connection cut between those two packets, a remote change after
    the value, and the standby missing the published value; the store keeps no history to
    tell that published change from one made during the failover."""
    panel_values = [value for kind, value in before + during if kind == "panel"]
    assume(len(panel_values) == len(set(panel_values)))
    world = World()
    world.play(before)
    assume(not (away and world.unrecorded_publish))
    # Away, it cannot tell a refused publish followed by a remote change after its marked
    # record from an accepted one: the store keeps no history (documented, open).
    assume(not (away and world.refused_publish and any(kind == "remote" for kind, _ in during)))
    world.play(during)
    latest = world.store[-1]
    assert latest.value is not None
    seen = [latest] if away else list(world.store)
    marker = world.marker(seen, latest.version if away else v(0))
    base = takeover_base(
        world.record, world.record, [*seen, *world.pending], world.controller, marker
    )
    decision = reconcile(
        base, encode_setpoint(latest.value), latest.version, world.controller, LIMITS
    )
    final = outcome(decision, world.controller)
    expected = world.controller if world.panel_pending else latest.value
    assert final == expected, (decision, world)


def test_without_the_pending_write_a_takeover_reverts_a_remote_change() -> None:
    """The defect the pending write closes: the former active applied 22 (version 1), could
    not record it (cut off), 23 came (version 2); the standby, away meanwhile, saw only 23."""
    record = Synced(20.0, v(0))
    latest = Synced(23.0, v(2))
    blind = takeover_base(record, record, [latest], controller=22.0)
    assert reconcile(blind, b"23.0", v(2), 22.0, LIMITS) == PublishToStore(
        22.0, "local change crossed a remote change while the agent was away"
    )
    told = takeover_base(record, record, [latest, Synced(22.0, v(1))], controller=22.0)
    assert reconcile(told, b"23.0", v(2), 22.0, LIMITS) == ApplyToController(23.0, v(2))


def test_a_published_value_marked_in_the_record_is_not_taken_for_a_panel_change() -> None:
    """The soak's D3: the former active published 24.5 (version 1) and died before it could
    record that version; its record, sent right after the value, says it published 24.5;
    a remote change 23 came after (version 2) and the new active never saw 24.5's version."""
    record = Synced(20.0, v(0))
    latest = Synced(23.0, v(2))
    blind = takeover_base(record, record, [latest], controller=24.5)
    assert isinstance(reconcile(blind, b"23.0", v(2), 24.5, LIMITS), PublishToStore)
    told = takeover_base(record, record, [latest], controller=24.5, published=24.5)
    assert reconcile(told, b"23.0", v(2), 24.5, LIMITS) == ApplyToController(23.0, v(2))
    # Not the controller's value any more (a panel change since): the marker says nothing.
    assert takeover_base(record, record, [latest], controller=26.5, published=24.5) == record


def test_a_marked_publish_the_store_refused_is_a_panel_change_still() -> None:
    """The 10-minute soak's lost panel change: the former active read 16.5 at the panel and
    published it; a remote change 20.0 (version 1) had reached the store first with the
    token of a renewal the active had not heard of, so the store refused 16.5; the record
    marked with it was written (version 2) and the active was killed before it could say
    so. The store's value is older than the record: the marker never reached the store."""
    record = Synced(18.0, v(0))
    assert published_marker(16.5, v(2), 20.0, v(1)) is None
    base = takeover_base(record, record, [Synced(20.0, v(1))], controller=16.5, published=None)
    assert isinstance(reconcile(base, b"20.0", v(1), 16.5, LIMITS), PublishToStore)
    # Accepted, then a remote change after the record: the marker holds.
    assert published_marker(16.5, v(2), 20.0, v(3)) == 16.5
    # Accepted and still in the store, whatever the versions say.
    assert published_marker(16.5, v(2), 16.5, v(1)) == 16.5
    # Nothing to weigh it against: kept.
    assert published_marker(16.5, None, 20.0, v(1)) == 16.5
    assert published_marker(16.5, v(2), None, None) == 16.5


def test_a_record_with_a_published_marker_round_trips() -> None:
    synced = Synced(21.5, v(3))
    raw = encode_record(synced, published=24.5)
    assert parse_full_record(raw) == SyncRecord(synced, published=24.5)
    assert parse_record(raw) == synced
