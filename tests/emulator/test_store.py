"""The store's state machine, rule by rule (protocol.md §2-§8). Time is injected."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.emulator.authz import Access
from agent.emulator.store import KeyNotification, Outcome, StateStore
from agent.protocol import errors
from agent.protocol.hlc import Hlc
from agent.protocol.resp3 import (
    OK,
    ErrorReply,
    Notification,
    decode_notification,
    decode_response,
    encode_request,
)

NOW = 1_700_000_000_000


class Clocks:
    def __init__(self) -> None:
        self.wall = NOW
        self.mono = 0

    def advance(self, ms: int) -> None:
        self.wall += ms
        self.mono += ms


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def store(clocks: Clocks) -> StateStore:
    return StateStore(lambda: clocks.wall, lambda: clocks.mono)


def ts(offset_ms: int = 0, counter: int = 0, node: str = "client") -> str:
    return str(Hlc(NOW + offset_ms, counter, node))


def call(
    store: StateStore,
    *args: bytes | str,
    client: str = "c1",
    timestamp: str | None = "default",
    token: str | Hlc | None = None,
) -> Outcome:
    raw = [a.encode() if isinstance(a, str) else a for a in args]
    return store.handle(
        client,
        encode_request(raw),
        ts() if timestamp == "default" else timestamp,
        None if token is None else str(token),
    )


def result(outcome: Outcome) -> object:
    return decode_response(outcome.reply.payload)


def error(outcome: Outcome) -> str:
    reply = result(outcome)
    assert isinstance(reply, ErrorReply), reply
    return reply.text


# ------------------------------------------------------------------ SET and GET


def test_set_then_get(store: StateStore) -> None:
    set_outcome = call(store, "SET", "k", "v")
    assert result(set_outcome) == OK
    get_outcome = call(store, "GET", "k")
    assert result(get_outcome) == b"v"
    assert get_outcome.reply.timestamp == set_outcome.reply.timestamp


def test_get_miss_has_no_timestamp(store: StateStore) -> None:
    outcome = call(store, "GET", "missing")
    assert result(outcome) is None
    assert outcome.reply.timestamp is None


def test_binary_keys_and_values(store: StateStore) -> None:
    key, value = b"\x00\xff\r\n", bytes(range(256))
    call(store, "SET", key, value)
    assert result(call(store, "GET", key)) == value
    assert result(call(store, "SET", "empty", b"")) == OK
    assert result(call(store, "GET", "empty")) == b""


def test_verbs_and_options_in_any_case(store: StateStore) -> None:
    assert result(call(store, "set", "k", "v", "nx", "px", "100")) == OK
    assert result(call(store, "Get", "k")) == b"v"
    assert result(call(store, "keynotify", "k", "stop")) == 0
    assert result(call(store, "vdel", "k", "v")) == 1


def test_version_is_strictly_greater_than_request_and_previous(store: StateStore) -> None:
    ahead = ts(30_000, 7)
    first = call(store, "SET", "k", "a", timestamp=ahead).reply.timestamp
    assert first is not None and first > Hlc.parse(ahead)
    second = call(store, "SET", "k", "b", timestamp=ts(-5000)).reply.timestamp
    assert second is not None and second > first


def test_versions_increase_when_the_wall_clock_steps_back(
    store: StateStore, clocks: Clocks
) -> None:
    first = call(store, "SET", "k", "a").reply.timestamp
    clocks.wall -= 3_600_000
    second = call(store, "SET", "k", "b", timestamp=ts(-3_600_000)).reply.timestamp
    assert first is not None and second is not None and second > first


def test_nx(store: StateStore) -> None:
    applied = call(store, "SET", "k", "a", "NX")
    assert result(applied) == OK
    refused = call(store, "SET", "k", "b", "NX")
    assert result(refused) == -1
    assert refused.reply.timestamp == applied.reply.timestamp  # the stored version
    assert result(call(store, "GET", "k")) == b"a"


def test_nex(store: StateStore) -> None:
    first = call(store, "SET", "lock", "me", "NEX", "PX", "1000")
    assert result(first) == OK
    renewed = call(store, "SET", "lock", "me", "NEX", "PX", "1000")
    assert result(renewed) == OK
    assert renewed.reply.timestamp is not None and first.reply.timestamp is not None
    assert renewed.reply.timestamp > first.reply.timestamp
    other = call(store, "SET", "lock", "you", "NEX", "PX", "1000")
    assert result(other) == -1
    assert other.reply.timestamp == renewed.reply.timestamp


def test_options_in_either_order(store: StateStore) -> None:
    assert result(call(store, "SET", "k", "v", "PX", "50", "NX")) == OK
    assert result(call(store, "SET", "k", "v", "PX", "50", "NX")) == -1


@pytest.mark.parametrize(
    "options",
    [
        ["PX", "0"],
        ["PX", "-5"],
        ["PX", "1.5"],
        ["PX"],
        ["PX", "x"],
        ["NX", "NEX"],
        ["NX", "NX"],
        ["PX", "5", "PX", "6"],
        ["XX"],
        ["EX", "5"],
    ],
)
def test_set_syntax_errors_write_nothing(store: StateStore, options: list[str]) -> None:
    assert error(call(store, "SET", "k", "v", *options)) == errors.SYNTAX_ERROR
    assert result(call(store, "GET", "k")) is None


def test_px_with_thousands_of_digits_is_a_syntax_error(store: StateStore) -> None:
    """Python refuses to parse integers past 4300 digits; that must not escape the store."""
    for digits in (20, 4301, 10_000):
        assert error(call(store, "SET", "k", "v", "PX", "9" * digits)) == errors.SYNTAX_ERROR
    assert result(call(store, "GET", "k")) is None
    # The longest accepted: 19 digits, as every number of the RESP3 decoder.
    assert result(call(store, "SET", "k", "v", "PX", "9" * 19)) == OK


def test_set_requires_a_timestamp(store: StateStore) -> None:
    assert error(call(store, "SET", "k", "v", timestamp=None)) == errors.MISSING_TIMESTAMP
    # Other commands do not.
    assert result(call(store, "GET", "k", timestamp=None)) is None
    assert result(call(store, "DEL", "k", timestamp=None)) == 0


@pytest.mark.parametrize("bad", ["", "x", "1:2", "a:b:c", "1:2:3:4", "9" * 5000 + ":0:n"])
def test_malformed_timestamp(store: StateStore, bad: str) -> None:
    assert error(call(store, "SET", "k", "v", timestamp=bad)) == errors.MALFORMED_TIMESTAMP
    assert error(call(store, "GET", "k", timestamp=bad)) == errors.MALFORMED_TIMESTAMP
    assert error(call(store, "SET", "k", "v", token=bad)) == errors.MALFORMED_TIMESTAMP


def test_timestamp_skew(store: StateStore) -> None:
    assert result(call(store, "SET", "k", "v", timestamp=ts(60_000))) == OK
    assert error(call(store, "SET", "k", "w", timestamp=ts(60_001))) == errors.TIMESTAMP_SKEW
    assert result(call(store, "GET", "k")) == b"v"
    # In the past is fine.
    assert result(call(store, "SET", "k", "x", timestamp=ts(-86_400_000))) == OK


def test_fencing_token_skew(store: StateStore) -> None:
    far = Hlc(NOW + 60_001, 0, "lock")
    assert error(call(store, "SET", "k", "v", token=far)) == errors.FENCING_TOKEN_SKEW


def test_skewed_timestamp_does_not_move_the_clock(store: StateStore) -> None:
    call(store, "SET", "k", "v", timestamp=ts(120_000))
    version = call(store, "SET", "k", "v").reply.timestamp
    assert version is not None and version.wall_ms < NOW + 60_000


def test_px_expiry_is_active_and_notifies_delete(store: StateStore, clocks: Clocks) -> None:
    call(store, "KEYNOTIFY", "k", client="watcher")
    call(store, "SET", "k", "v", "PX", "100")
    clocks.advance(99)
    assert store.expire() == []
    assert store.next_expiry_ms() == 100
    clocks.advance(1)
    expired = store.expire()
    assert [(n.client_id, n.key) for n in expired] == [("watcher", b"k")]
    assert decode_notification(expired[0].payload) == Notification("DELETE")
    assert result(call(store, "GET", "k")) is None
    assert store.next_expiry_ms() is None


def test_a_full_counter_59_s_ahead_never_wedges_the_store(
    store: StateStore, clocks: Clocks
) -> None:
    """`<now + 59 s>:99998:x` once made every later tick raise until the wall clock caught up."""
    call(store, "KEYNOTIFY", "k", client="watcher")
    assert result(call(store, "SET", "k", "v", "PX", "50")) == OK
    hostile = ts(59_000, counter=99_998, node="x")
    assert result(call(store, "SET", "other", "v", timestamp=hostile)) == OK
    versions = []
    for _ in range(3):
        set_outcome = call(store, "SET", "other", "w")
        assert result(set_outcome) == OK
        versions.append(set_outcome.reply.timestamp)
        assert result(call(store, "DEL", "nothing")) == 0
        assert result(call(store, "VDEL", "nothing", "v")) == 0
        assert result(call(store, "KEYNOTIFY", "other", client="late")) == OK
    assert versions == sorted(versions) and len(set(versions)) == 3
    clocks.advance(50)
    expired = store.expire()
    assert [(n.client_id, n.key) for n in expired] == [("watcher", b"k")]
    assert decode_notification(expired[0].payload) == Notification("DELETE")
    assert expired[0].timestamp > versions[-1]


def test_set_without_px_clears_expiry(store: StateStore, clocks: Clocks) -> None:
    call(store, "SET", "k", "v", "PX", "100")
    call(store, "SET", "k", "w")
    clocks.advance(1000)
    assert store.expire() == []
    assert result(call(store, "GET", "k")) == b"w"


def test_renewal_pushes_the_deadline(store: StateStore, clocks: Clocks) -> None:
    call(store, "SET", "k", "v", "PX", "100")
    clocks.advance(80)
    call(store, "SET", "k", "v", "NEX", "PX", "100")
    clocks.advance(80)
    assert store.expire() == []
    clocks.advance(20)
    assert len(store.expire()) == 0  # nobody watches, but the key is gone
    assert result(call(store, "GET", "k")) is None


def test_expiry_is_on_the_monotonic_clock(store: StateStore, clocks: Clocks) -> None:
    call(store, "SET", "k", "v", "PX", "1000")
    clocks.wall += 3_600_000  # a wall-clock step does not expire keys
    assert result(call(store, "GET", "k", timestamp=None)) == b"v"


def test_expired_key_is_gone_before_the_next_request(store: StateStore, clocks: Clocks) -> None:
    call(store, "SET", "k", "v", "PX", "10")
    clocks.advance(10)
    assert result(call(store, "SET", "k", "w", "NX")) == OK


# ------------------------------------------------------------------ DEL and VDEL


def test_del(store: StateStore) -> None:
    call(store, "SET", "k", "v")
    outcome = call(store, "DEL", "k")
    assert result(outcome) == 1
    assert outcome.reply.timestamp is not None
    assert result(call(store, "DEL", "k")) == 0


def test_vdel(store: StateStore) -> None:
    assert result(call(store, "VDEL", "k", "v")) == 0
    call(store, "SET", "k", "v")
    assert result(call(store, "VDEL", "k", "other")) == -1
    assert result(call(store, "GET", "k")) == b"v"
    assert result(call(store, "VDEL", "k", "v")) == 1
    assert result(call(store, "GET", "k")) is None


def test_delete_timestamps_are_the_service_clock(store: StateStore) -> None:
    setv = call(store, "SET", "k", "v").reply.timestamp
    deleted = call(store, "DEL", "k").reply.timestamp
    missing = call(store, "DEL", "k").reply.timestamp
    notify = call(store, "KEYNOTIFY", "k").reply.timestamp
    assert setv is not None and deleted is not None and missing is not None
    assert notify is not None and setv < deleted < missing < notify


# ------------------------------------------------------------------ errors of any command


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["SET", "k"], errors.WRONG_NUMBER_OF_ARGUMENTS),
        (["SET"], errors.WRONG_NUMBER_OF_ARGUMENTS),
        (["GET"], errors.WRONG_NUMBER_OF_ARGUMENTS),
        (["GET", "k", "x"], errors.WRONG_NUMBER_OF_ARGUMENTS),
        (["DEL", "k", "x"], errors.WRONG_NUMBER_OF_ARGUMENTS),
        (["VDEL", "k"], errors.WRONG_NUMBER_OF_ARGUMENTS),
        (["KEYNOTIFY"], errors.WRONG_NUMBER_OF_ARGUMENTS),
        (["KEYNOTIFY", "k", "STOP", "x"], errors.WRONG_NUMBER_OF_ARGUMENTS),
        (["KEYNOTIFY", "k", "GO"], errors.SYNTAX_ERROR),
        (["HSET", "k", "v"], errors.UNKNOWN_COMMAND),
        (["SET", "", "v"], errors.KEY_LENGTH_ZERO),
        (["GET", ""], errors.KEY_LENGTH_ZERO),
        (["DEL", ""], errors.KEY_LENGTH_ZERO),
        (["VDEL", "", "v"], errors.KEY_LENGTH_ZERO),
        (["KEYNOTIFY", ""], errors.KEY_LENGTH_ZERO),
    ],
)
def test_request_errors(store: StateStore, args: list[str], text: str) -> None:
    outcome = call(store, *args)
    assert error(outcome) == text
    assert outcome.notifications == []


@pytest.mark.parametrize("payload", [b"", b"garbage", b"*1\r\n$3\r\nGET", b"+OK\r\n"])
def test_malformed_payload_is_a_syntax_error(store: StateStore, payload: bytes) -> None:
    reply = decode_response(store.handle("c1", payload, ts()).reply.payload)
    assert reply == ErrorReply(errors.SYNTAX_ERROR)


def test_errors_carry_the_service_clock(store: StateStore) -> None:
    assert call(store, "NOPE").reply.timestamp is not None


def test_quota(clocks: Clocks) -> None:
    store = StateStore(lambda: clocks.wall, lambda: clocks.mono, quota=2)
    call(store, "SET", "a", "1")
    call(store, "SET", "b", "1")
    assert error(call(store, "SET", "c", "1")) == errors.QUOTA_EXCEEDED
    assert result(call(store, "SET", "a", "2")) == OK  # updating is not creating
    call(store, "DEL", "a")
    assert result(call(store, "SET", "c", "1")) == OK


def test_not_authorized(clocks: Clocks) -> None:
    store = StateStore(
        lambda: clocks.wall,
        lambda: clocks.mono,
        authorizer=lambda client, key, access: not key.startswith(b"secret"),
    )
    assert error(call(store, "GET", "secret\\x")) == errors.NOT_AUTHORIZED
    assert error(call(store, "SET", "secret\\x", "v")) == errors.NOT_AUTHORIZED
    assert result(call(store, "SET", "public", "v")) == OK


def test_the_authorizer_is_told_reads_from_writes(clocks: Clocks) -> None:
    seen: list[tuple[str, bytes, Access]] = []

    def read_only(client: str, key: bytes, access: Access) -> bool:
        seen.append((client, key, access))
        return access is Access.READ

    store = StateStore(lambda: clocks.wall, lambda: clocks.mono, authorizer=read_only)
    assert result(call(store, "GET", "k")) is None
    assert result(call(store, "KEYNOTIFY", "k")) == OK
    for command in (["SET", "k", "v"], ["DEL", "k"], ["VDEL", "k", "v"]):
        assert error(call(store, *command)) == errors.NOT_AUTHORIZED
    assert [access for _, _, access in seen] == [Access.READ] * 2 + [Access.WRITE] * 3
    assert {client for client, _, _ in seen} == {"c1"}


# ------------------------------------------------------------------ fencing (§5)


def lock(store: StateStore, holder: str = "a") -> Hlc:
    outcome = call(store, "SET", "lock", holder, "NEX", "PX", "3000")
    assert result(outcome) == OK
    assert outcome.reply.timestamp is not None
    return outcome.reply.timestamp


def test_fencing_token_is_stored_with_the_first_fenced_write(store: StateStore) -> None:
    token = lock(store)
    assert result(call(store, "SET", "sp", "21", token=token)) == OK
    entry = store.entry(b"sp")
    assert entry is not None and entry.fencing_token == token


def test_unfenced_key_accepts_unfenced_writes(store: StateStore) -> None:
    assert result(call(store, "SET", "sp", "21")) == OK
    assert result(call(store, "SET", "sp", "22")) == OK


@pytest.mark.parametrize("command", [["SET", "sp", "x"], ["DEL", "sp"], ["VDEL", "sp", "21"]])
def test_token_required_once_a_key_holds_one(store: StateStore, command: list[str]) -> None:
    call(store, "SET", "sp", "21", token=lock(store))
    assert error(call(store, *command)) == errors.FENCING_TOKEN_REQUIRED
    assert result(call(store, "GET", "sp")) == b"21"  # GET never needs one


@pytest.mark.parametrize("command", [["SET", "sp", "x"], ["DEL", "sp"], ["VDEL", "sp", "21"]])
def test_older_token_is_rejected(store: StateStore, command: list[str]) -> None:
    old = lock(store)
    new = lock(store)
    call(store, "SET", "sp", "21", token=new)
    assert error(call(store, *command, token=old)) == errors.FENCING_TOKEN_LOWER_VERSION
    assert result(call(store, "GET", "sp")) == b"21"


def test_equal_and_newer_tokens_pass_and_newer_replaces(store: StateStore) -> None:
    first = lock(store)
    call(store, "SET", "sp", "1", token=first)
    assert result(call(store, "SET", "sp", "2", token=first)) == OK
    newer = lock(store)
    assert result(call(store, "SET", "sp", "3", token=newer)) == OK
    assert error(call(store, "SET", "sp", "4", token=first)) == errors.FENCING_TOKEN_LOWER_VERSION
    entry = store.entry(b"sp")
    assert entry is not None and entry.fencing_token == newer


def test_tokens_compare_as_clocks_not_strings(store: StateStore) -> None:
    call(store, "SET", "sp", "1", token="2:0:a")
    # "10" < "2" as text, but 10 > 2 as a clock.
    assert result(call(store, "SET", "sp", "2", token="10:0:a")) == OK


def test_deleting_removes_the_token(store: StateStore, clocks: Clocks) -> None:
    call(store, "SET", "sp", "1", token=lock(store))
    assert result(call(store, "DEL", "sp", token=lock(store))) == 1
    assert result(call(store, "SET", "sp", "2")) == OK  # no token needed any more
    call(store, "SET", "tmp", "1", "PX", "10", token=lock(store))
    clocks.advance(10)
    store.expire()
    assert result(call(store, "SET", "tmp", "2")) == OK


def test_stale_writer_is_stopped_only_after_the_new_owner_wrote(store: StateStore) -> None:
    old = lock(store, "a")
    call(store, "SET", "sp", "1", token=old)
    new = lock(store, "a")  # the same holder renewing; a new owner works the same way
    assert result(call(store, "SET", "sp", "2", token=old)) == OK  # new owner not written yet
    call(store, "SET", "sp", "3", token=new)
    assert error(call(store, "SET", "sp", "4", token=old)) == errors.FENCING_TOKEN_LOWER_VERSION


def test_fencing_is_checked_before_the_condition(store: StateStore) -> None:
    call(store, "SET", "sp", "1", token=lock(store))
    assert error(call(store, "SET", "sp", "1", "NX")) == errors.FENCING_TOKEN_REQUIRED


# ------------------------------------------------------------------ notifications (§7)


def notified(outcome: Outcome) -> list[tuple[str, bytes, Notification]]:
    return [(n.client_id, n.key, decode_notification(n.payload)) for n in outcome.notifications]


def test_keynotify_works_for_absent_keys_and_is_idempotent(store: StateStore) -> None:
    assert result(call(store, "KEYNOTIFY", "k")) == OK
    assert result(call(store, "KEYNOTIFY", "k")) == OK
    assert store.registrations("c1") == {b"k"}
    outcome = call(store, "SET", "k", "v", client="writer")
    assert notified(outcome) == [("c1", b"k", Notification("SET", b"v"))]
    assert outcome.notifications[0].timestamp == outcome.reply.timestamp


def test_every_change_notifies_every_registrant(store: StateStore) -> None:
    call(store, "KEYNOTIFY", "k", client="a")
    call(store, "KEYNOTIFY", "k", client="b")
    assert [n[0] for n in notified(call(store, "SET", "k", "1", client="a"))] == ["a", "b"]
    deleted = call(store, "DEL", "k", client="b")
    assert notified(deleted) == [
        ("a", b"k", Notification("DELETE")),
        ("b", b"k", Notification("DELETE")),
    ]
    assert deleted.notifications[0].timestamp == deleted.reply.timestamp
    call(store, "SET", "k", "v")
    assert len(notified(call(store, "VDEL", "k", "v"))) == 2


def test_no_notification_when_nothing_changed(store: StateStore) -> None:
    call(store, "KEYNOTIFY", "k", client="a")
    call(store, "SET", "k", "1")
    assert call(store, "SET", "k", "2", "NX").notifications == []
    assert call(store, "VDEL", "k", "other").notifications == []
    assert call(store, "DEL", "missing").notifications == []
    assert call(store, "GET", "k").notifications == []


def test_stop(store: StateStore) -> None:
    call(store, "KEYNOTIFY", "k")
    assert result(call(store, "KEYNOTIFY", "k", "STOP")) == OK
    assert result(call(store, "KEYNOTIFY", "k", "STOP")) == 0
    assert call(store, "SET", "k", "v").notifications == []
    assert store.registrations("c1") == set()


def test_registrations_are_per_client_and_key(store: StateStore) -> None:
    call(store, "KEYNOTIFY", "k1", client="a")
    call(store, "KEYNOTIFY", "k2", client="a")
    call(store, "KEYNOTIFY", "k1", client="b")
    call(store, "KEYNOTIFY", "k1", "STOP", client="a")
    assert [n[0] for n in notified(call(store, "SET", "k1", "v"))] == ["b"]
    assert [n[0] for n in notified(call(store, "SET", "k2", "v"))] == ["a"]


def test_client_gone_drops_its_registrations(store: StateStore) -> None:
    call(store, "KEYNOTIFY", "k", client="a")
    call(store, "KEYNOTIFY", "k", client="b")
    store.client_gone("a")
    assert store.registrations("a") == set()
    assert [n[0] for n in notified(call(store, "SET", "k", "v"))] == ["b"]
    store.client_gone("b")
    store.client_gone("never-seen")
    assert call(store, "SET", "k", "w").notifications == []


def test_expiry_notifications_come_before_the_reply_that_follows(
    store: StateStore, clocks: Clocks
) -> None:
    call(store, "KEYNOTIFY", "k", client="a")
    call(store, "SET", "k", "v", "PX", "5")
    clocks.advance(5)
    outcome = call(store, "SET", "k", "w")
    kinds = [n[2].kind for n in notified(outcome)]
    assert kinds == ["DELETE", "SET"]


# ------------------------------------------------------------------ model-based check


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["SET", "SETNX", "SETNEX", "SETPX", "GET", "DEL", "VDEL", "TICK"]),
            st.sampled_from([b"a", b"b"]),
            st.sampled_from([b"1", b"2"]),
        ),
        max_size=40,
    )
)
def test_matches_a_dictionary_model(ops: list[tuple[str, bytes, bytes]]) -> None:
    clocks = Clocks()
    store = StateStore(lambda: clocks.wall, lambda: clocks.mono)
    model: dict[bytes, tuple[bytes, int | None]] = {}
    versions: dict[bytes, Hlc] = {}
    for op, key, value in ops:
        if op == "TICK":
            clocks.advance(7)
            model = {k: v for k, v in model.items() if v[1] is None or v[1] > clocks.mono}
            continue
        model = {k: v for k, v in model.items() if v[1] is None or v[1] > clocks.mono}
        if op.startswith("SET"):
            extra = {"SET": [], "SETNX": ["NX"], "SETNEX": ["NEX"], "SETPX": ["PX", "10"]}[op]
            outcome = call(store, "SET", key, value, *extra)
            allowed = (op != "SETNX" or key not in model) and (
                op != "SETNEX" or key not in model or model[key][0] == value
            )
            assert result(outcome) == (OK if allowed else -1)
            if allowed:
                model[key] = (value, clocks.mono + 10 if op == "SETPX" else None)
                version = outcome.reply.timestamp
                assert version is not None
                assert key not in versions or version > versions[key]
                versions[key] = version
        elif op == "GET":
            assert result(call(store, "GET", key)) == model.get(key, (None,))[0]
        elif op == "DEL":
            assert result(call(store, "DEL", key)) == (1 if model.pop(key, None) else 0)
        else:
            expected = 0 if key not in model else (1 if model[key][0] == value else -1)
            assert result(call(store, "VDEL", key, value)) == expected
            if expected == 1:
                del model[key]
    store.expire()
    assert len(store) == len(model)


def test_key_notification_type_is_exposed() -> None:
    assert KeyNotification("c", b"k", b"", Hlc(1, 0, "s")).client_id == "c"
