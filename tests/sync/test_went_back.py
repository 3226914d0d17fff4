"""A store that went back in time: a key older than a value it is known to have held (it
lost writes it had acknowledged). Its stale value is never a change made by anyone."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent.controller.interface import Limits
from agent.controller.points import SET_POINT
from agent.protocol.hlc import Hlc
from agent.sync.decisions import (
    ApplyToController,
    PublishToStore,
    Synced,
    encode_setpoint,
    newest_held,
    reconcile,
    takeover_base,
    went_back,
)
from agent.sync.history import StoreHistory
from agent.sync.recollection import Recollection
from tests.support.examples import examples
from tests.sync.test_takeover import World, outcome, step, v

LIMITS = Limits(5.0, 35.0, 0.5)
values = st.sampled_from([20.0, 21.5, 23.5])
versions = st.integers(0, 20).map(lambda n: Hlc(1000 + n, 0, "s"))


@given(values, versions, values, versions, values)
def test_a_key_older_than_the_last_sync_holds_no_change(
    synced_value: float, synced_at: Hlc, stale: float, stale_at: Hlc, controller: float
) -> None:
    """Whatever the stale key holds, it never reaches the unit: the unit's value (the last
    synced one, or a panel change made since) is published over it."""
    synced = Synced(synced_value, synced_at)
    raw = str(stale).encode()
    decision = reconcile(synced, raw, stale_at, controller, LIMITS)
    if stale_at < synced_at:
        assert went_back(stale_at, synced_at)
        assert isinstance(decision, PublishToStore) and decision.value == controller
        assert not decision.only_if_absent
    else:
        assert not went_back(stale_at, synced_at)
    if stale_at <= synced_at:
        assert not isinstance(decision, ApplyToController)


@given(values, versions)
def test_a_key_the_store_lost_gets_the_units_value(controller: float, synced_at: Hlc) -> None:
    decision = reconcile(Synced(23.5, synced_at), None, None, controller, LIMITS)
    assert isinstance(decision, PublishToStore) and decision.value == controller


@given(st.lists(st.tuples(st.one_of(st.none(), values), st.one_of(st.none(), versions))))
def test_the_newest_value_held_is_the_one_to_give_back(
    held: list[tuple[float | None, Hlc | None]],
) -> None:
    syncs = [Synced(value, version) for value, version in held]
    newest = newest_held(syncs)
    complete = [s for s in syncs if s.value is not None and s.version is not None]
    if not complete:
        assert newest is None
        return
    assert newest in complete
    assert all(
        s.version is not None and newest.version is not None and s.version <= newest.version
        for s in complete
    )


def test_a_takeover_gives_back_the_newest_value_it_knows_of() -> None:
    """What this instance synced, the record's, the values seen while standby and every
    change delivered all count; a value that is no set point does not."""
    past = Recollection(SET_POINT)
    past.follow_value(b"21.5", Hlc(1005, 0, "s"))
    past.history.saw(23.5, Hlc(1007, 0, "s"))
    past.history.saw(None, Hlc(1009, 0, "s"))  # a value that did not parse
    assert past.newest_held(Synced(20.0, Hlc(1001, 0, "s"))) == (b"23.5", Hlc(1007, 0, "s"))
    assert past.newest_held(Synced(22.0, Hlc(1008, 0, "s"))) == (b"22.0", Hlc(1008, 0, "s"))
    assert Recollection(SET_POINT).newest_held(Synced()) is None
    assert StoreHistory().values() == ()


@settings(max_examples=examples(500, 100), deadline=None)
@given(
    st.lists(step, max_size=12),
    st.lists(step.filter(lambda s: s[0] != "active"), max_size=4),
    st.integers(1, 6),
)
def test_no_change_is_lost_when_the_store_goes_back_before_a_takeover(
    before: list[tuple[str, float]], during: list[tuple[str, float]], lost: int
) -> None:
    """The failover of test_takeover, then the store loses its last `lost` changes of the key
    (all of them: the key is gone). The standby, which watched the key, fences it: a key
    older than the newest value it knows gets that value back, at a newer version. The end
    is what it would have been had the store lost nothing (had it kept the key)."""
    panel_values = [value for kind, value in before + during if kind == "panel"]
    assume(len(panel_values) == len(set(panel_values)))
    world = World()
    world.play(before)
    world.play(during)
    seen = list(world.store)
    expected = world.controller if world.panel_pending else seen[-1].value
    marker = world.marker(seen, v(0))
    kept = seen[:-lost]
    restore = newest_held([world.record, *seen])
    assert restore is not None and restore.value is not None
    if not kept:
        # The key is gone: nothing to fence, and the unit's value is published again (a
        # remote change not applied yet was lost by the store, not by the agent).
        store_raw, store_version = None, None
        expected = world.controller
    elif went_back(kept[-1].version, restore.version):
        store_raw, store_version = encode_setpoint(float(restore.value)), world.next_version()
    else:
        store_raw, store_version = encode_setpoint(float(kept[-1].value or 0)), kept[-1].version
    base = takeover_base(world.record, world.record, seen, world.controller, marker)
    decision = reconcile(base, store_raw, store_version, world.controller, LIMITS)
    assert outcome(decision, world.controller) == expected, (decision, world)
