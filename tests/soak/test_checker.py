"""The soak's checker finds each kind of violation it is there for, and passes a clean run."""

from __future__ import annotations

from tests.soak.checker import Checker, LineEvent, StoreEvent, UnitEvent

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
