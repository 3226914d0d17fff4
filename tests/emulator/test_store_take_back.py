"""Changes whose records could not be kept are taken back: the store then holds exactly
what it held after the last record kept. Pure: a journal that only numbers records."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.emulator.store import Entry, StateStore
from agent.protocol.hlc import Hlc
from agent.protocol.resp3 import encode_request
from tests.emulator.test_store import NOW, Clocks


class NumberingJournal:
    def __init__(self) -> None:
        self.appended = 0
        self.accepts_sets = True

    def writable(self) -> bool:
        return self.accepts_sets

    def put(self, key: bytes, entry: Entry) -> int:
        self.appended += 1
        return self.appended

    def delete(self, key: bytes) -> int:
        self.appended += 1
        return self.appended

    def observe_clock(self, current: Hlc) -> None:
        pass


operations = st.lists(
    st.tuples(
        st.sampled_from(["SET", "SETPX", "DEL", "VDEL", "WAIT"]),
        st.sampled_from([b"a", b"b", b"c"]),
        st.sampled_from([b"1", b"2"]),
    ),
    max_size=30,
)


@given(operations, st.data())
def test_taking_back_returns_to_the_state_after_the_last_record_kept(
    ops: list[tuple[str, bytes, bytes]], data: st.DataObject
) -> None:
    clocks = Clocks()
    journal = NumberingJournal()
    store = StateStore(lambda: clocks.wall, lambda: clocks.mono, journal=journal)
    after: dict[int, dict[bytes, Entry]] = {0: {}}  # record number -> the keys then
    for op, key, value in ops:
        if op == "WAIT":
            clocks.advance(60)
            store.expire()
        else:
            args = {
                "SET": [b"SET", key, value],
                "SETPX": [b"SET", key, value, b"PX", b"50"],
                "DEL": [b"DEL", key],
                "VDEL": [b"VDEL", key, value],
            }[op]
            store.handle("c1", encode_request(args), str(Hlc(NOW, 0, "client")))
        after[journal.appended] = dict(store.entries())
    # An expiry may write several records: a failure falls between operations here.
    kept_now = data.draw(st.sampled_from(sorted(after)))
    store.kept(kept_now)
    kept = data.draw(st.sampled_from([n for n in sorted(after) if n >= kept_now]))
    store.take_back(kept)
    expected = after[kept]
    assert store.entries() == expected
    # Deadlines come back with their keys: what expires is what had expired by then.
    clocks.advance(1_000)
    store.expire()
    assert store.entries() == {k: e for k, e in expected.items() if e.expires_at_ms is None}


def test_a_set_is_refused_while_the_journal_cannot_keep_it_and_a_delete_is_not() -> None:
    clocks = Clocks()
    journal = NumberingJournal()
    store = StateStore(lambda: clocks.wall, lambda: clocks.mono, journal=journal)
    now = str(Hlc(NOW, 0, "client"))
    assert store.handle("c1", encode_request([b"SET", b"k", b"v"]), now).reply.payload == (
        b"+OK\r\n"
    )
    journal.accepts_sets = False
    refused = store.handle("c1", encode_request([b"SET", b"j", b"v"]), now).reply.payload
    assert refused == b"-ERR the store cannot write to its disk\r\n"
    assert store.handle("c1", encode_request([b"DEL", b"k"]), now).reply.payload == b":1\r\n"
