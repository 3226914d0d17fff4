from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.controller.interface import Limits
from agent.protocol.hlc import Hlc
from agent.sync.decisions import (
    ApplyToController,
    Ignore,
    InvalidRemoteValue,
    PublishToStore,
    Record,
    Reject,
    Synced,
    base_after_a_lost_race,
    encode_setpoint,
    on_poll,
    on_remote_change,
    parse_setpoint,
    reconcile,
    settled,
    still_pending,
)

LIMITS = Limits(5.0, 35.0, 0.5)
V1, V2, V3 = Hlc(1000, 0, "s"), Hlc(2000, 0, "s"), Hlc(3000, 0, "s")


@pytest.mark.parametrize(
    ("value", "text"), [(21.5, b"21.5"), (22.0, b"22.0"), (21.25, b"21.25"), (5, b"5.0")]
)
def test_encode(value: float, text: bytes) -> None:
    assert encode_setpoint(value) == text
    assert parse_setpoint(text) == value


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b" 21.5",
        b"21.5\n",
        b"21,5",
        b"nan",
        b"inf",
        b"-inf",
        b"1e3",
        b"0x10",
        b"21.",
        b".5",
        b"\xff",
        b"twenty",
        b"12345.6",
        b"+21",
    ],
)
def test_parse_rejects(raw: bytes) -> None:
    with pytest.raises(InvalidRemoteValue):
        parse_setpoint(raw)


@given(st.floats(5, 35).map(lambda f: round(f * 2) / 2))
def test_encode_round_trips(value: float) -> None:
    assert parse_setpoint(encode_setpoint(value)) == value


# ------------------------------------------------------------------ remote changes


def test_remote_change_is_applied() -> None:
    decision = on_remote_change(Synced(20.0, V1), b"22.5", V2, 20.0, LIMITS)
    assert decision == ApplyToController(22.5, V2)


def test_own_write_echo_and_old_notifications_are_ignored() -> None:
    assert isinstance(on_remote_change(Synced(22.5, V2), b"22.5", V2, 22.5, LIMITS), Ignore)
    assert isinstance(on_remote_change(Synced(22.5, V2), b"19.0", V1, 22.5, LIMITS), Ignore)


def test_remote_equal_to_controller_is_recorded() -> None:
    assert on_remote_change(Synced(20.0, V1), b"20.0", V2, 20.0, LIMITS) == Record(20.0, V2)


@pytest.mark.parametrize("raw", [b"40.0", b"4.5", b"nan", b"abc", b"", b"1e1", b"-0.0"])
def test_invalid_remote_values_never_reach_the_controller(raw: bytes) -> None:
    decision = on_remote_change(Synced(20.0, V1), raw, V2, 20.0, LIMITS)
    assert isinstance(decision, Reject)


def test_unrounded_remote_value_is_applied_rounded_and_corrected_in_the_store() -> None:
    decision = on_remote_change(Synced(20.0, V1), b"21.3", V2, 20.0, LIMITS)
    assert decision == ApplyToController(21.5, V2, correct_store=True)
    # Even when the controller already holds the rounded value.
    decision = on_remote_change(Synced(21.5, V1), b"21.4", V2, 21.5, LIMITS)
    assert decision == ApplyToController(21.5, V2, correct_store=True)


def test_crossing_local_change_wins_by_reaching_the_store_last() -> None:
    # Panel set 24.0 after the last sync; a remote 22.0 arrives before the next poll.
    decision = on_remote_change(Synced(20.0, V1), b"22.0", V2, 24.0, LIMITS)
    assert isinstance(decision, PublishToStore) and decision.value == 24.0


# ------------------------------------------------------------------ polls


def test_poll() -> None:
    assert isinstance(on_poll(Synced(20.0, V1), 20.0), Ignore)
    assert on_poll(Synced(20.0, V1), 21.0) == PublishToStore(21.0, "local change")
    assert isinstance(on_poll(Synced(), 21.0), PublishToStore)


# ------------------------------------------------------------------ reconcile


def test_reconcile_cases() -> None:
    synced = Synced(20.0, V2)
    # Nothing changed.
    assert isinstance(reconcile(synced, b"20.0", V2, 20.0, LIMITS), Ignore)
    # A remote change made while away is applied.
    assert reconcile(synced, b"23.0", V3, 20.0, LIMITS) == ApplyToController(23.0, V3)
    # A local change made while away is not overwritten by the older store value.
    decision = reconcile(synced, b"20.0", V2, 25.0, LIMITS)
    assert isinstance(decision, PublishToStore) and decision.value == 25.0
    # Both: the local change reaches the store last.
    decision = reconcile(synced, b"23.0", V3, 25.0, LIMITS)
    assert isinstance(decision, PublishToStore) and "crossed" in decision.reason
    # The key is gone: the controller's value is published again.
    assert isinstance(reconcile(synced, None, None, 20.0, LIMITS), PublishToStore)
    # An invalid store value is not applied.
    assert isinstance(reconcile(synced, b"99", V3, 20.0, LIMITS), Reject)


def test_first_run_takes_the_store_as_reference() -> None:
    assert reconcile(Synced(), b"23.0", V2, 20.0, LIMITS) == ApplyToController(23.0, V2)
    assert reconcile(Synced(), b"20.0", V2, 20.0, LIMITS) == Record(20.0, V2)
    assert isinstance(reconcile(Synced(), None, None, 20.0, LIMITS), PublishToStore)


def test_a_first_publish_that_lost_the_race_to_a_remote_change_keeps_a_later_panel_change() -> None:
    """A point never synced: its key empty, the unit's 24.0 published only if the key stays
    empty, and a remote 23.0 written first. The reading is the base: a panel change made
    since is published (the crossing rule), a unit that still holds it takes the remote
    change; the first-run rule alone wrote 23.0 over the panel's 29.0."""
    first = reconcile(Synced(), None, None, 24.0, LIMITS)
    assert isinstance(first, PublishToStore) and first.only_if_absent
    base = base_after_a_lost_race(Synced(), 24.0)
    assert base == Synced(24.0, None)
    crossed = reconcile(base, b"23.0", V2, 29.0, LIMITS)
    assert isinstance(crossed, PublishToStore) and crossed.value == 29.0
    assert "crossed" in crossed.reason
    assert reconcile(base, b"23.0", V2, 24.0, LIMITS) == ApplyToController(23.0, V2)
    assert on_remote_change(base, b"23.0", V2, 24.0, LIMITS) == ApplyToController(23.0, V2)
    assert reconcile(Synced(), b"23.0", V2, 29.0, LIMITS) == ApplyToController(23.0, V2)
    # Something synced already is the base as it is.
    assert base_after_a_lost_race(Synced(20.0, V1), 24.0) == Synced(20.0, V1)


values = st.sampled_from([b"20.0", b"21.5", b"22.0", b"99.0", b"x", b"21.3"])
controllers = st.sampled_from([20.0, 21.5, 22.0])
versions = st.integers(0, 5).map(lambda n: Hlc(1000 + n, 0, "s"))
synceds = st.builds(Synced, st.one_of(st.none(), controllers), st.one_of(st.none(), versions))


@given(synceds, values, versions, controllers)
def test_remote_decisions_are_safe(
    synced: Synced, raw: bytes, version: Hlc, controller: float
) -> None:
    decision = on_remote_change(synced, raw, version, controller, LIMITS)
    if synced.version is not None and version <= synced.version:
        assert isinstance(decision, Ignore)  # never re-applied, never looped
    if isinstance(decision, ApplyToController):
        assert LIMITS.min <= decision.value <= LIMITS.max
        assert math.isclose(decision.value * 2, round(decision.value * 2))
        assert decision.version == version
    if isinstance(decision, PublishToStore):
        assert decision.value == controller


@given(synceds, st.one_of(st.none(), values), versions, controllers)
def test_reconcile_never_loses_a_local_change(
    synced: Synced, raw: bytes | None, version: Hlc, controller: float
) -> None:
    decision = reconcile(synced, raw, version if raw else None, controller, LIMITS)
    if synced.value is not None and controller != synced.value:
        assert isinstance(decision, PublishToStore) and decision.value == controller
        # Published over whatever the store holds, except over nothing: a remote change
        # written to an empty store meanwhile is applied instead.
        assert decision.only_if_absent == (raw is None)
    assert not (isinstance(decision, ApplyToController) and raw in (b"99.0", b"x"))


# ------------------------------------------------------------------ writes in doubt


def test_a_controller_holding_a_pending_write_holds_the_agents_write() -> None:
    synced = Synced(20.0, V1)
    pending = (Synced(22.0, V2),)
    assert settled(synced, pending, 22.0) == Synced(22.0, V2)
    assert settled(synced, pending, 20.0) == synced  # the write never reached it
    assert settled(synced, pending, 24.5) == synced  # a panel change
    # The newest of several pending writes of the same value.
    assert settled(synced, (Synced(22.0, V2), Synced(22.0, V3)), 22.0) == Synced(22.0, V3)
    # Pending writes older than the sync are settled already.
    assert settled(Synced(20.0, V3), (Synced(22.0, V2),), 22.0) == Synced(20.0, V3)


def test_a_write_in_doubt_then_newer_remote_changes_is_no_panel_change() -> None:
    # 22 (version 2) was written and its answer never came; the unit was quarantined while
    # 23 (version 3) was accepted. The unit answers again, holding 22.
    synced, pending = Synced(20.0, V1), (Synced(22.0, V2),)
    base = settled(synced, pending, 22.0)
    assert reconcile(base, b"23.0", V3, 22.0, LIMITS) == ApplyToController(23.0, V3)
    # Taken as a panel change, it would have been published over 23.
    assert isinstance(reconcile(synced, b"23.0", V3, 22.0, LIMITS), PublishToStore)


def test_pending_writes_are_bounded_and_pruned_by_a_sync() -> None:
    writes = tuple(Synced(20.0 + n, Hlc(1000 + n, 0, "s")) for n in range(10))
    assert still_pending(writes, Synced()) == writes[-4:]
    assert still_pending(writes, Synced(25.0, Hlc(1005, 0, "s"))) == writes[6:]
