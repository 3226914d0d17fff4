"""A unit back from an absence (unplugged, reset, powered off, replaced) holding other
values than those last synced: the store's values go back to it, or its own are published,
as its profile says; never a panel change without a word (decisions.after_absence)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.controller.interface import Limits
from agent.controller.points import POINTS
from agent.protocol.hlc import Hlc
from agent.sync.decisions import (
    ApplyToController,
    Ignore,
    PublishToStore,
    Record,
    Reject,
    Rules,
    Synced,
    absence_words,
    after_absence,
    reconcile,
)
from agent.sync.record import encode_record, parse_full_record

LIMITS = Limits(5.0, 35.0, 0.5)
V1, V2, V3 = Hlc(1000, 0, "s"), Hlc(2000, 0, "s"), Hlc(3000, 0, "s")


def test_a_reset_unit_gets_the_stores_values_back() -> None:
    # The operator's 22.5 synced; the unit comes back at its factory 20.0.
    decision = after_absence("store", Synced(22.5, V1), b"22.5", V1, 20.0, LIMITS)
    assert isinstance(decision, ApplyToController) and decision.value == 22.5
    assert decision.version == V1
    words = absence_words(decision)
    assert words is not None
    assert "back after an absence with 20.0, not the synced 22.5" in words
    assert "the store's 22.5 goes back to it" in words
    # As reconcile alone took it: a panel change while the agent was away, published.
    plain = reconcile(Synced(22.5, V1), b"22.5", V1, 20.0, LIMITS)
    assert isinstance(plain, PublishToStore) and absence_words(plain) is None


def test_a_unit_whose_panel_is_the_master_has_its_value_published() -> None:
    decision = after_absence("unit", Synced(22.5, V1), b"22.5", V1, 20.0, LIMITS)
    assert isinstance(decision, PublishToStore) and decision.value == 20.0
    assert decision.after_absence and "the unit's value wins" in decision.reason


def test_a_remote_change_made_during_the_absence_goes_to_the_unit_either_way() -> None:
    for policy in ("store", "unit"):
        decision = after_absence(policy, Synced(22.5, V1), b"24.0", V2, 22.5, LIMITS)
        assert isinstance(decision, ApplyToController) and decision.value == 24.0
        assert absence_words(decision) is None  # the unit held the synced value: no absence


def test_a_store_value_the_unit_cannot_take_is_refused_not_written() -> None:
    decision = after_absence("store", Synced(22.5, V1), b"99.0", V2, 20.0, LIMITS)
    assert isinstance(decision, Reject) and decision.restore == 20.0


def test_other_points_are_named_in_their_own_words() -> None:
    rules = Rules(POINTS["mode"])
    decision = after_absence("store", Synced("cool", V1), b"cool", V1, "auto", rules)
    assert isinstance(decision, ApplyToController) and decision.value == "cool"
    assert "with auto, not the synced cool" in (absence_words(decision) or "")


values = st.sampled_from([5.0, 20.0, 21.5, 22.5, 35.0])
versions = st.sampled_from([None, V1, V2, V3])


@given(
    policy=st.sampled_from(["store", "unit"]),
    synced_value=st.one_of(st.none(), values),
    synced_version=versions,
    raw=st.one_of(st.none(), values.map(lambda v: f"{v:.1f}".encode())),
    version=versions,
    controller=values,
)
def test_after_an_absence_the_policy_decides_and_says_so(
    policy: str,
    synced_value: float | None,
    synced_version: Hlc | None,
    raw: bytes | None,
    version: Hlc | None,
    controller: float,
) -> None:
    synced = Synced(synced_value, synced_version)
    decision = after_absence(policy, synced, raw, version, controller, LIMITS)
    ordinary = reconcile(synced, raw, version, controller, LIMITS)
    if synced_value is None or raw is None or controller == synced_value:
        # Nothing to tell: as ever, in sync recorded as such (the absence is over).
        in_sync = Record(controller, synced_version)
        assert decision == (in_sync if isinstance(ordinary, Ignore) else ordinary)
        return
    if float(raw) == controller:
        assert decision == Record(controller, version)  # the store holds it already
        return
    assert absence_words(decision) is not None
    if policy == "unit":
        assert isinstance(decision, PublishToStore) and decision.value == controller
    else:
        assert isinstance(decision, ApplyToController)
        assert decision.value == float(raw) and decision.value != controller
    assert not isinstance(decision, Ignore | Record)


def test_the_sync_record_says_a_unit_is_away_until_it_syncs_again() -> None:
    synced = Synced(22.5, V1)
    away = parse_full_record(encode_record(synced, away=True))
    assert away.away and away.synced == synced
    assert b"away" not in encode_record(synced)
    assert not parse_full_record(encode_record(synced)).away
    # An older agent's record, or anything but true, is no absence.
    assert not parse_full_record(b'{"value":22.5,"version":"%s","away":1}' % str(V1).encode()).away
