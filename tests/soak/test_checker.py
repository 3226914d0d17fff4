"""The soak's checker finds each kind of violation it is there for, and passes a clean run."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.soak.checker import Checker, LineEvent, StoreEvent, UnitEvent, _Grants, _newer

LOCK = b"l\\lock"
KEY = b"d1\\setPoint"


def checker() -> Checker:
    return Checker({1: "d1"}, LOCK)


def store(
    at: float,
    client: str,
    key: bytes,
    value: bytes | None,
    *,
    token: str | None = None,
    version: str | None = None,
    accepted: bool = True,
    command: str = "SET",
) -> StoreEvent:
    return StoreEvent(at, client, command, key, value, token, accepted, version)


def v(n: int) -> str:
    return f"{1_700_000_000_000 + n:015d}:00000:s"


def test_overlapping_masters_and_collisions() -> None:
    c = checker()
    c.line = [
        LineEvent(1.0, "tcp-1", 1, "GET STATE", None, False),
        LineEvent(2.0, "tcp-2", 1, "GET STATE", None, False),
        LineEvent(3.0, "tcp-1", 1, "GET STATE", None, False),
    ]
    c.check_one_master()
    assert [x.kind for x in c.violations] == ["two masters"]
    clean = checker()
    clean.line = [
        LineEvent(1.0, "tcp-1", 1, "GET STATE", None, False),
        LineEvent(2.0, "tcp-2", 1, "GET STATE", None, True),
    ]
    clean.check_one_master()
    assert [x.kind for x in clean.violations] == ["two masters"]  # the collision


def test_a_write_with_a_token_older_than_another_holders() -> None:
    c = checker()
    c.store = [
        store(1.0, "agent-l-a", LOCK, b"a#1", version=v(1)),
        store(2.0, "agent-l-b", LOCK, b"b#2", version=v(2)),
        store(3.0, "agent-l-a", KEY, b"20.0", token=v(1)),  # a's old lease, after b's grant
        store(4.0, "agent-l-b", KEY, b"21.0", token=v(2)),
    ]
    c.check_tokens()
    assert [x.kind for x in c.violations] == ["stale token"]


def test_renewals_of_the_same_holder_are_not_newer_holders() -> None:
    c = checker()
    c.store = [
        store(1.0, "agent-l-a", LOCK, b"a#1", version=v(1)),
        store(2.0, "agent-l-a", LOCK, b"a#1", version=v(2)),
        store(3.0, "agent-l-a", KEY, b"20.0", token=v(1)),
    ]
    c.check_tokens()
    assert c.violations == []


HISTORY = b"l\\history"


def test_a_step_down_recorded_with_the_lease_just_lost_before_the_next_record() -> None:
    """a steps down (the store forgot its lease), b is granted the lock, then a's step-down
    lands in the line's history with a's token, before b's takeover record: allowed there,
    and only there; a record older than one the store accepted before it is not."""
    c = checker()
    c.history_key = HISTORY
    c.store = [
        store(1.0, "agent-l-a", LOCK, b"a#1", version=v(1)),
        store(1.1, "agent-l-a", HISTORY, b"[takeover a]", token=v(1)),
        store(2.0, "agent-l-b", LOCK, b"b#2", version=v(2)),
        store(2.1, "agent-l-a", HISTORY, b"[step-down a]", token=v(1)),
        store(2.2, "agent-l-b", HISTORY, b"[takeover b]", token=v(2)),
    ]
    c.check_tokens()
    assert c.violations == [] and c.checked["history records"] == 3
    c.store.append(store(2.3, "agent-l-a", HISTORY, b"[late]", token=v(1)))
    c.check_tokens()
    assert [x.kind for x in c.violations] == ["stale history record"]
    assert "with " + v(1) + " after a record with " + v(2) in c.violations[0].detail
    # A store that forgot its contents forgot the history's fence with them.
    c.violations.clear()
    c.wiped_at = [2.25]
    c.check_tokens()
    assert c.violations == []
    # Without the history key named, the same record is a stale token like any other.
    c.history_key = None
    c.wiped_at = []
    c.check_tokens()
    assert [x.kind for x in c.violations] == ["stale token", "stale token"]


def test_a_panel_change_written_over_before_it_was_published() -> None:
    c = checker()
    c.units = [UnitEvent(1.0, 1, "panel", 18.0), UnitEvent(3.0, 1, "write", 22.0)]
    c.line = [LineEvent(2.0, "tcp-1", 1, "GET STATE", None, False)]  # read after the change
    c.check_changes({1: 22.0}, {1: b"22.0"})
    assert [x.kind for x in c.violations] == ["panel change lost"] and c.lost == 1
    raced = checker()  # changed between the read and the write: counted apart
    raced.units = [UnitEvent(2.5, 1, "panel", 18.0), UnitEvent(3.0, 1, "write", 22.0)]
    raced.line = [LineEvent(2.0, "tcp-1", 1, "GET STATE", None, False)]
    raced.check_changes({1: 22.0}, {1: b"22.0"})
    assert raced.violations == [] and raced.raced == 1


def test_a_stale_value_published_over_a_remote_change() -> None:
    c = checker()
    c.store = [
        store(1.0, "agent-l-a", KEY, b"20.0", token=v(1)),
        store(2.0, "remote", KEY, b"24.0", token=v(1)),
        store(3.0, "agent-l-b", KEY, b"20.0", token=v(2)),  # the old value, no panel change
    ]
    c.units = [UnitEvent(0.5, 1, "write", 20.0)]
    c.check_changes({1: 20.0}, {1: b"20.0"})
    assert [x.kind for x in c.violations] == ["stale value published"]


def test_a_panel_change_turned_over_again_before_its_publish_landed_is_no_stale_value() -> None:
    c = checker()
    c.units = [
        UnitEvent(0.5, 1, "write", 20.0),
        UnitEvent(2.1, 1, "panel", 18.0),  # read by the agent, published...
        UnitEvent(2.4, 1, "panel", 21.5),  # ...turned again before the publish landed
    ]
    c.store = [
        store(1.0, "agent-l-a", KEY, b"20.0", token=v(1)),
        store(2.0, "remote", KEY, b"27.5", token=v(1)),
        store(2.8, "agent-l-a", KEY, b"18.0", token=v(1)),
        store(3.2, "agent-l-a", KEY, b"21.5", token=v(1)),
    ]
    c.check_changes({1: 21.5}, {1: b"21.5"})
    assert c.violations == [] and c.lost == 0
    again = checker()  # the superseded value once more, after the newer one: stale
    again.units = c.units
    again.store = [*c.store, store(3.5, "agent-l-a", KEY, b"18.0", token=v(1))]
    again.check_changes({1: 21.5}, {1: b"18.0"})
    assert "stale value published" in [x.kind for x in again.violations]


def test_crossing_changes_and_a_wiped_store_are_fine() -> None:
    c = checker()
    c.units = [UnitEvent(1.0, 1, "write", 20.0), UnitEvent(2.0, 1, "panel", 18.0)]
    c.store = [
        store(0.5, "agent-l-a", KEY, b"20.0", token=v(1)),
        store(2.5, "remote", KEY, b"24.0", token=v(1)),
        store(3.0, "agent-l-a", KEY, b"18.0", token=v(1)),  # the panel change wins
        store(5.0, "agent-l-b", KEY, b"18.0", token=v(2)),  # published again after a wipe
    ]
    c.wiped_at = [4.0]
    c.check_changes({1: 18.0}, {1: b"18.0"})
    assert c.violations == [] and c.lost == 0


def test_disagreement_at_the_end_is_a_loss() -> None:
    c = checker()
    c.check_changes({1: 20.0}, {1: b"21.0"})
    assert [x.kind for x in c.violations] == ["no agreement"] and c.lost == 1


def lease(at: float, holder: bytes, px: int = 1000, command: str = "SET") -> StoreEvent:
    return StoreEvent(at, "agent-l-x", command, LOCK, holder, None, True, v(int(at * 10)), px)


def test_every_transaction_on_the_wire_lies_within_a_lease_the_store_granted() -> None:
    c = checker()
    c.store = [
        lease(1.0, b"a#1"),
        lease(1.5, b"a#1"),  # a renewal: a's lease now runs to 2.5
        lease(2.0, b"a#1", command="VDEL"),  # released at 2.0
        lease(3.0, b"b#2"),
    ]
    assert c.leases() == {"a": [(1.0, 2.0)], "b": [(3.0, 4.0)]}
    c.line = [
        LineEvent(1.2, "a-1", 1, "SET SP", 20.0, False, 1.25, "a"),  # inside
        LineEvent(1.9, "a-1", 1, "SET SP", 21.0, False, 2.05, "a"),  # its last byte after
        LineEvent(3.5, "b-2", 1, "GET STATE", None, False, 3.55, "b"),  # inside
        LineEvent(4.5, "b-2", 1, "GET STATE", None, False, 4.55, "b"),  # after the expiry
        LineEvent(0.5, "pty", 1, "GET STATE", None, False, 0.55, None),  # not an instance's
    ]
    c.check_wire()
    assert [(x.kind, round(x.at, 1)) for x in c.violations] == [
        ("outside the lease", 1.9),
        ("outside the lease", 4.5),
    ]
    assert c.checked["transactions on the wire"] == 4
    assert c.checked["writes on the wire"] == 2


def test_a_request_that_waited_for_the_line_counts_from_when_it_was_sent() -> None:
    c = checker()
    c.store = [lease(1.0, b"a#1")]
    # Sent at 0.9, before the grant, and held until the line was free at 1.1.
    c.line = [LineEvent(1.1, "a-1", 1, "GET STATE", None, False, 1.15, "a", 0.9)]
    c.check_wire()
    assert [x.kind for x in c.violations] == ["outside the lease"]


# --- whole thermostats: each point checked on its own ------------------------------------

MODE = b"d1\\mode"
POINTS = ("setPoint", "mode", "occupied")


def thermostat() -> Checker:
    return Checker({1: "d1"}, LOCK, points=POINTS)


def test_a_points_panel_change_written_over_is_lost_whatever_the_set_point_does() -> None:
    c = thermostat()
    c.units = [
        UnitEvent(1.0, 1, "panel", "cool", "mode"),
        UnitEvent(2.5, 1, "write", 22.0),  # the set point's own write: no harm to mode
        UnitEvent(3.0, 1, "write", "heat", "mode"),
    ]
    c.line = [LineEvent(2.0, "tcp-1", 1, "GET POINTS", None, False)]  # read every point
    final = {(1, "setPoint"): 22.0, (1, "mode"): "heat", (1, "occupied"): True}
    stored = {(1, "setPoint"): b"22.0", (1, "mode"): b"heat", (1, "occupied"): b"true"}
    c.check_changes(final, stored)
    assert [x.kind for x in c.violations] == ["panel change lost"], c.violations
    assert "d1 mode: heat written over cool" in c.violations[0].detail
    assert c.checked["changes of mode"] == 1 and c.checked["changes of setPoint"] == 0


def test_a_read_of_the_set_point_alone_has_not_read_the_other_points() -> None:
    c = thermostat()
    c.units = [
        UnitEvent(1.0, 1, "panel", "cool", "mode"),
        UnitEvent(3.0, 1, "write", "heat", "mode"),
    ]
    c.line = [LineEvent(2.0, "tcp-1", 1, "GET STATE", None, False, points=("setPoint",))]
    final = {(1, "setPoint"): 20.0, (1, "mode"): "heat", (1, "occupied"): True}
    stored = {(1, "setPoint"): b"20.0", (1, "mode"): b"heat", (1, "occupied"): b"true"}
    c.check_changes(final, stored)
    assert c.violations == [] and c.raced == 1


def test_a_stale_switch_published_and_a_point_that_disagrees_at_the_end() -> None:
    c = thermostat()
    occupied = b"d1\\occupied"
    c.store = [
        store(1.0, "agent-l-a", occupied, b"true", token=v(1)),
        store(2.0, "remote", occupied, b"false", token=v(1)),
        store(3.0, "agent-l-b", occupied, b"true", token=v(2)),  # reverted: no panel change
        store(3.5, "remote", MODE, b"fan", token=v(2)),  # never applied
    ]
    c.units = [UnitEvent(0.5, 1, "write", True, "occupied")]
    final = {(1, "setPoint"): 20.0, (1, "mode"): "heat", (1, "occupied"): True}
    stored = {(1, "setPoint"): b"20.0", (1, "mode"): b"fan", (1, "occupied"): b"true"}
    c.check_changes(final, stored)
    assert [(x.kind, x.detail.split(":")[0]) for x in c.violations] == [
        ("stale value published", "d1 occupied"),
        ("no agreement", "d1 mode"),
    ]


def test_a_panel_change_to_the_value_a_remote_change_just_wrote_is_published_with_it() -> None:
    """The unit is turned to the value a remote change has just put in the store (a switch
    has two): the agent publishes it (the crossing rule), the same value the store holds; a
    later remote change may then turn it over."""
    c = thermostat()
    occupied = b"d1\\occupied"
    c.units = [
        UnitEvent(0.5, 1, "write", True, "occupied"),
        UnitEvent(2.1, 1, "panel", False, "occupied"),
        UnitEvent(5.0, 1, "write", True, "occupied"),
    ]
    c.line = [LineEvent(2.2, "tcp-1", 1, "GET POINTS", None, False)]
    c.store = [
        store(1.0, "agent-l-a", occupied, b"true", token=v(1)),
        store(2.0, "remote", occupied, b"false", token=v(1)),
        store(2.3, "agent-l-a", occupied, b"false", token=v(1)),  # the panel's, crossed
        store(4.0, "remote", occupied, b"true", token=v(1)),
    ]
    final = {(1, "setPoint"): 20.0, (1, "mode"): "heat", (1, "occupied"): True}
    stored = {(1, "setPoint"): b"20.0", (1, "mode"): b"heat", (1, "occupied"): b"true"}
    c.check_changes(final, stored)
    assert c.violations == [] and c.lost == 0


def switch_turned_to_the_stores_value_then_crossed(*, applied_before: bool) -> Checker:
    """A switch: the store holds a remote change (False) the unit has not taken (it is
    quarantined); a knob turns the unit to that value, a remote change turns the store back
    to True before the agent sees the knob; the agent then publishes False. With
    `applied_before`, the agent had written True to the unit (read after) first."""
    c = thermostat()
    occupied = b"d1\\occupied"
    c.units = [
        UnitEvent(0.5, 1, "write", True, "occupied"),
        UnitEvent(3.0, 1, "panel", False, "occupied"),
    ]
    c.line = [LineEvent(4.5, "tcp-1", 1, "GET POINTS", None, False)]
    if applied_before:
        c.units.append(UnitEvent(4.2, 1, "write", True, "occupied"))
    c.store = [
        store(1.0, "agent-l-a", occupied, b"true", token=v(1)),
        store(2.0, "remote", occupied, b"false", token=v(1)),  # not applied yet
        store(4.0, "remote", occupied, b"true", token=v(1)),
        store(4.6, "agent-l-a", occupied, b"false", token=v(1)),
    ]
    final = {(1, "setPoint"): 20.0, (1, "mode"): "heat", (1, "occupied"): False}
    stored = {(1, "setPoint"): b"20.0", (1, "mode"): b"heat", (1, "occupied"): b"false"}
    if applied_before:
        final[(1, "occupied")] = True
    c.check_changes(final, stored)
    return c


def test_a_knob_turned_to_the_stores_value_and_crossed_by_a_remote_change_wins() -> None:
    """The panel change agreed with the store when it was made, but a remote change of the
    other value came before the agent noticed it: both happened while the agent was away,
    and the panel change reaches the store last (design.md, "Crossing changes")."""
    c = switch_turned_to_the_stores_value_then_crossed(applied_before=False)
    assert c.violations == [] and c.lost == 0, c.violations


def test_a_knob_turned_to_the_stores_value_is_stale_once_a_write_went_over_it() -> None:
    c = switch_turned_to_the_stores_value_then_crossed(applied_before=True)
    assert [x.kind for x in c.violations][:1] == ["stale value published"], c.violations
    assert "d1 occupied: published False" in c.violations[0].detail


def test_a_knob_turned_to_the_value_the_store_holds_is_not_lost_when_written_over() -> None:
    """Turned to the store's value (a remote change the unit had not taken yet): nothing to
    publish; a later remote change written over it loses nothing."""
    c = thermostat()
    c.units = [
        UnitEvent(0.5, 1, "write", "heat", "mode"),
        UnitEvent(2.0, 1, "panel", "cool", "mode"),
        UnitEvent(4.0, 1, "write", "auto", "mode"),
    ]
    c.line = [LineEvent(2.5, "tcp-1", 1, "GET POINTS", None, False)]
    c.store = [
        store(1.0, "agent-l-a", MODE, b"heat", token=v(1)),
        store(1.5, "remote", MODE, b"cool", token=v(1)),
        store(3.0, "remote", MODE, b"auto", token=v(1)),
    ]
    final = {(1, "setPoint"): 20.0, (1, "mode"): "auto", (1, "occupied"): True}
    stored = {(1, "setPoint"): b"20.0", (1, "mode"): b"auto", (1, "occupied"): b"true"}
    c.check_changes(final, stored)
    assert c.violations == [] and c.lost == 0, c.violations


def lost_race(*, refused: bytes) -> Checker:
    """The store forgot its contents; a remote change (25.0) re-creates the key before the
    agent's publish of the unit's value to the empty key (`refused`) lands: the remote
    change is applied over the panel change made before the wipe (22.0)."""
    c = checker()
    c.units = [
        UnitEvent(0.5, 1, "write", 20.0),
        UnitEvent(1.5, 1, "panel", 21.0),
        UnitEvent(2.5, 1, "panel", 22.0),
        UnitEvent(6.0, 1, "write", 25.0),
    ]
    c.line = [LineEvent(2.6, "tcp-1", 1, "GET STATE", None, False)]
    c.wiped_at = [3.0]
    c.store = [
        store(1.0, "agent-l-a", KEY, b"20.0", token=v(1)),
        store(4.0, "remote", KEY, b"25.0", token=v(2)),
        store(4.5, "agent-l-a", KEY, refused, token=v(2), accepted=False),
    ]
    c.check_changes({1: 25.0}, {1: b"25.0"})
    return c


def test_a_publish_to_the_empty_key_that_lost_the_race_gives_way_to_the_remote_change() -> None:
    c = lost_race(refused=b"22.0")
    assert c.violations == [] and c.lost == 0, c.violations
    assert c.checked["publishes that lost the race to a remote change"] == 1


def test_a_panel_change_made_after_the_reading_that_lost_the_race_is_still_owed() -> None:
    """The refused publish carried an older reading (21.0): the panel change made since
    (22.0) is still to be published, not written over."""
    c = lost_race(refused=b"21.0")
    assert [x.kind for x in c.violations] == ["panel change lost"], c.violations


def test_a_refused_publish_to_a_key_the_agents_wrote_since_the_store_had_it() -> None:
    """Refused while the key holds an agent's write since the store had it (a former
    active's late write, refused by the newer fence): the panel change is still owed."""
    c = checker()
    c.units = [
        UnitEvent(0.5, 1, "write", 20.0),
        UnitEvent(2.5, 1, "panel", 22.0),
        UnitEvent(6.0, 1, "write", 25.0),
    ]
    c.line = [LineEvent(2.6, "tcp-1", 1, "GET STATE", None, False)]
    c.store = [
        store(1.0, "agent-l-a", KEY, b"20.0", token=v(1)),
        store(4.0, "remote", KEY, b"25.0", token=v(2)),
        store(4.5, "agent-l-a", KEY, b"22.0", token=v(1), accepted=False),
    ]
    c.check_changes({1: 25.0}, {1: b"25.0"})
    assert [x.kind for x in c.violations] == ["panel change lost"], c.violations


@given(
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=40),
    st.lists(st.tuples(st.integers(0, 45), st.sampled_from(["a", "b", "c", None])), max_size=20),
)
def test_the_first_newer_grant_of_another_holder_is_found_as_a_scan_finds_it(
    holders: list[str], queries: list[tuple[int, str | None]]
) -> None:
    """The bisection over runs of renewals finds what a scan of every grant finds."""
    grants = _Grants()
    versions = [f"{1000 + n}:0:store" for n in range(len(holders))]
    for version, holder in zip(versions, holders, strict=True):
        grants.add(version, holder)
    for position, own in queries:
        token = f"{1000 + position}:0:store"
        scan = [h for v, h in zip(versions, holders, strict=True) if _newer(v, token) and h != own]
        assert grants.first_newer_other(token, own) == (scan[0] if scan else None)


def went_back_after_a_synced_panel_change() -> Checker:
    """The panel's 23.5 published over 20.0; the store then went back to 20.0, losing it."""
    c = checker()
    c.units = [UnitEvent(1.0, 1, "write", 20.0), UnitEvent(2.0, 1, "panel", 23.5)]
    c.store = [
        store(0.5, "remote", KEY, b"20.0", token=v(1)),
        store(2.5, "agent-l-a", KEY, b"23.5", token=v(1)),
    ]
    c.rolled_back = [(3.0, {KEY: (b"20.0", [b"23.5"])})]
    return c


def test_a_synced_change_the_store_lost_and_the_agent_applied_back_is_lost() -> None:
    c = went_back_after_a_synced_panel_change()
    c.store.append(store(4.0, "agent-l-a", KEY, b"20.0", token=v(2)))  # fenced stale
    c.units.append(UnitEvent(4.5, 1, "write", 20.0))
    c.check_changes({1: 20.0}, {1: b"20.0"})
    assert [x.kind for x in c.violations] == ["synced change lost"] and c.lost == 1


def test_a_synced_change_the_store_lost_and_the_agent_gave_back_is_fine() -> None:
    c = went_back_after_a_synced_panel_change()
    c.store.append(store(4.0, "agent-l-a", KEY, b"23.5", token=v(2)))  # given back
    c.check_changes({1: 23.5}, {1: b"23.5"})
    assert c.violations == [] and c.lost == 0


def test_a_remote_change_the_store_lost_is_not_the_agents_loss() -> None:
    """A remote 26.0 accepted, then lost by the store before the agent applied it; and a
    remote change made after the store went back wins over the synced value, as any does."""
    c = checker()
    c.units = [UnitEvent(1.0, 1, "write", 20.0)]
    c.store = [
        store(0.5, "remote", KEY, b"20.0", token=v(1)),
        store(2.0, "remote", KEY, b"26.0", token=v(1)),
    ]
    c.rolled_back = [(3.0, {KEY: (b"20.0", [b"26.0"])})]
    c.check_changes({1: 20.0}, {1: b"20.0"})
    assert c.violations == [] and c.lost == 0
    c = went_back_after_a_synced_panel_change()
    c.store.append(store(4.0, "remote", KEY, b"20.0", token=v(2)))
    c.units.append(UnitEvent(4.5, 1, "write", 20.0))
    c.check_changes({1: 20.0}, {1: b"20.0"})
    assert c.violations == [] and c.lost == 0


def test_a_store_gone_back_to_a_remote_change_the_unit_never_took_has_it_applied() -> None:
    """Remote 26.0 accepted while the unit held 20.0 and not applied yet; remote 20.0 (the
    unit's value) after it; the store loses the second and holds 26.0 again: applying 26.0
    applies an accepted change, and the lost 20.0 is the store's loss. Once the unit has
    been written or turned since, writing the value the store went back to over it is not."""
    c = checker()
    c.units = [UnitEvent(1.0, 1, "write", 20.0)]
    c.store = [
        store(0.5, "remote", KEY, b"20.0", token=v(1)),
        store(2.0, "remote", KEY, b"26.0", token=v(1)),
        store(2.5, "agent-l-a", KEY, b"26.0", token=v(2)),  # a new active fences it
        store(3.0, "remote", KEY, b"20.0", token=v(2)),
    ]
    c.rolled_back = [(3.5, {KEY: (b"26.0", [b"20.0"])})]
    c.units.append(UnitEvent(4.0, 1, "write", 26.0))
    c.check_changes({1: 26.0}, {1: b"26.0"})
    assert c.violations == [] and c.lost == 0
    c = went_back_after_a_synced_panel_change()  # the unit turned since: 20.0 is stale
    c.store.insert(1, store(1.5, "remote", KEY, b"26.0", token=v(1)))
    c.rolled_back = [(3.0, {KEY: (b"26.0", [b"23.5"])})]
    c.units.append(UnitEvent(4.5, 1, "write", 26.0))
    c.check_changes({1: 26.0}, {1: b"26.0"})
    assert [x.kind for x in c.violations] == ["synced change lost"] and c.lost == 1
