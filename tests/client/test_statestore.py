"""StateStoreClient against the embedded store and against the service on mosquitto."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from unittest.mock import ANY

import pytest

from agent.client import errors, statestore
from agent.client.session import Message, NotConnected, Session
from agent.client.statestore import EARLIER_KEPT, Condition, KeyChange, StateStoreClient
from agent.protocol import topics
from agent.protocol.hlc import Hlc
from agent.protocol.resp3 import Notification, encode_notification
from tests.support.store_backends import DENIED_PREFIX, QUOTA, StoreBackend

_ids = itertools.count()


def unique(prefix: str = "key") -> bytes:
    return f"{prefix}-{next(_ids)}-{time.monotonic_ns()}".encode()


def _future(ms: int) -> Hlc:
    return Hlc(time.time_ns() // 1_000_000 + ms, 0, "x")


class Changes:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[KeyChange] = asyncio.Queue()

    def __call__(self, change: KeyChange) -> None:
        self.queue.put_nowait(change)

    async def next(self, within: float = 5.0) -> KeyChange:
        return await asyncio.wait_for(self.queue.get(), within)


@pytest.fixture
async def connect(
    store_backend: StoreBackend,
) -> AsyncIterator[Callable[..., asyncio.Future[StateStoreClient]]]:
    opened: list[tuple[Session, StateStoreClient]] = []

    async def open_client(name: str = "client", **kwargs: object) -> StateStoreClient:
        session = Session(store_backend.settings(), client_id=f"{name}-{next(_ids)}")
        await session.start(timeout=10)
        options: dict[str, object] = {"request_timeout_s": 2.0, **kwargs}
        client = StateStoreClient(session, **options)  # type: ignore[arg-type]
        await client.start()
        opened.append((session, client))
        return client

    yield open_client  # type: ignore[misc]
    for session, client in opened:
        await client.close()
        await session.stop()


async def test_set_get_delete_vdelete(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    client = await connect()
    key = unique()
    assert await client.get(key) == (None, None)
    first = await client.set(key, b"21.5")
    assert first.applied and first.version is not None
    value, version = await client.get(key)
    assert (value, version) == (b"21.5", first.version)
    second = await client.set(key, "22")
    assert second.version is not None and second.version > first.version
    assert await client.vdelete(key, b"nope") == -1
    assert await client.vdelete(key, b"22") == 1
    assert await client.vdelete(key, b"22") == 0
    await client.set(key, b"x")
    assert await client.delete(key) == 1
    assert await client.delete(key) == 0


async def test_conditions_and_expiry(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    client = await connect()
    key = unique()
    assert (await client.set(key, b"a", condition=Condition.NX)).applied
    refused = await client.set(key, b"b", condition=Condition.NX)
    assert not refused.applied and refused.version is not None
    assert not (await client.set(key, b"b", condition=Condition.NEX)).applied
    assert (await client.set(key, b"a", condition=Condition.NEX, expiry_ms=200)).applied
    changes = Changes()
    await client.observe(key, changes)
    change = await changes.next()
    assert (change.kind, change.value) == ("DELETE", None)
    assert await client.get(key) == (None, None)
    with pytest.raises(ValueError):
        await client.set(key, b"a", expiry_ms=0)


async def test_fencing(connect: Callable[..., asyncio.Future[StateStoreClient]]) -> None:
    client = await connect()
    lock, key = unique("lock"), unique()
    old = (await client.set(lock, b"me", condition=Condition.NEX, expiry_ms=5000)).version
    new = (await client.set(lock, b"me", condition=Condition.NEX, expiry_ms=5000)).version
    assert old is not None and new is not None and new > old
    assert (await client.set(key, b"1", fencing_token=new)).applied
    with pytest.raises(errors.FencingTokenLowerVersion):
        await client.set(key, b"2", fencing_token=old)
    with pytest.raises(errors.FencingTokenRequired):
        await client.set(key, b"2")
    with pytest.raises(errors.FencingTokenRequired):
        await client.delete(key)
    with pytest.raises(errors.FencingTokenLowerVersion):
        await client.vdelete(key, b"1", fencing_token=old)
    assert await client.delete(key, fencing_token=new) == 1


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: c.get(b""), errors.KeyLengthZero),
        (lambda c: c.get(DENIED_PREFIX + "x"), errors.NotAuthorized),
        (
            lambda c: c.set(b"k", b"v", fencing_token=_future(120_000)),
            errors.FencingTokenSkew,
        ),
    ],
)
async def test_service_errors_map_to_types(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
    call: Callable[[StateStoreClient], asyncio.Future[object]],
    error: type[errors.ServiceError],
) -> None:
    client = await connect()
    with pytest.raises(error) as caught:
        await call(client)
    assert caught.value.text == error.text


async def test_quota_exceeded(
    store_backend: StoreBackend, connect: Callable[..., asyncio.Future[StateStoreClient]]
) -> None:
    client = await connect()
    for index in range(QUOTA - len(store_backend.store)):
        store_backend.write_directly(b"fill-%d" % index, b"x")
    with pytest.raises(errors.QuotaExceeded):
        await client.set(unique(), b"v")


async def test_every_error_text_has_its_type() -> None:
    from agent.protocol import errors as texts

    kinds = {type(errors.service_error(text)) for text in texts.ALL}
    assert len(kinds) == len(texts.ALL)
    assert errors.ServiceError not in kinds
    unknown = errors.service_error("something new")
    assert type(unknown) is errors.ServiceError and unknown.text == "something new"


async def test_raw_errors_of_the_service(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    """Texts only a malformed request can produce, sent through the client's own path."""
    client = await connect()
    cases = [
        ([b"NOPE", b"k"], errors.UnknownCommand),
        ([b"GET"], errors.WrongNumberOfArguments),
        ([b"SET", b"k", b"v", b"PX", b"0"], errors.SyntaxErrorReply),
    ]
    for args, error in cases:
        with pytest.raises(error):
            await client._request(args, None, None)


async def test_timestamp_errors_of_the_service(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    client = await connect()
    session = client.session
    for properties, error in [
        ([], errors.MissingTimestamp),
        ([(topics.TIMESTAMP, "garbage")], errors.MalformedTimestamp),
        ([(topics.TIMESTAMP, str(_future(120_000)))], errors.TimestampSkew),
    ]:
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        correlation = b"%016d" % next(_ids)
        client._pending[correlation] = future
        await session.publish(
            topics.INVOKE_TOPIC,
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n",
            response_topic=topics.response_topic(session.client_id),
            correlation_data=correlation,
            user_properties=properties,
        )
        with pytest.raises(error):
            client._parse_response(await asyncio.wait_for(future, 5))


async def test_a_client_behind_the_service_clock_still_talks(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    # A gateway whose wall clock is two minutes behind the service: what it learns from the
    # service's answers runs far ahead of its own wall clock, but the service is the judge
    # of skew (protocol.md §4), and it accepts what this client sends.
    client = await connect(wall_clock=lambda: time.time_ns() // 1_000_000 - 120_000)
    await client.delete(b"any")  # its response merges the service's clock
    assert (await client.set(b"any", b"v")).applied
    assert await client.get(b"any") == (b"v", ANY)


async def test_observe_delivers_changes_in_order_with_versions(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    watcher, writer = await connect("watcher"), await connect("writer")
    key = unique()
    changes = Changes()
    assert await watcher.observe(key, changes) == (None, None)
    versions = []
    for value in (b"1", b"2", b"3"):
        versions.append((await writer.set(key, value)).version)
    await writer.delete(key)
    seen = [await changes.next() for _ in range(4)]
    assert [(c.kind, c.value) for c in seen] == [
        ("SET", b"1"),
        ("SET", b"2"),
        ("SET", b"3"),
        ("DELETE", None),
    ]
    assert [c.version for c in seen[:3]] == versions
    assert seen[3].version is not None and seen[3].version > versions[2]

    await watcher.unobserve(key)
    await writer.set(key, b"4")
    await watcher.get(key)  # a round trip after the change
    assert changes.queue.empty()


async def test_old_notifications_are_dropped(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    client = await connect()
    key = unique()
    changes = Changes()
    await client.observe(key, changes)
    version = (await client.set(key, b"new")).version
    assert (await changes.next()).value == b"new"
    assert version is not None
    stale = Message(
        topics.notify_topic(client.client_id, key),
        encode_notification(Notification("SET", b"old")),
        user_properties=[(topics.TIMESTAMP, str(Hlc(version.wall_ms - 1, 0, "statestore")))],
    )
    client._on_notification(stale)
    client._on_notification(Message(topics.notify_topic(client.client_id, key), b"garbage"))
    await client.set(key, b"newer")
    assert (await changes.next()).value == b"newer"


async def test_calling_the_client_from_a_handler_does_not_deadlock(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    client = await connect()
    key, echo = unique(), unique("echo")
    done: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()

    async def handler(change: KeyChange) -> None:
        await client.set(echo, change.value or b"")
        value, _ = await client.get(echo)
        done.set_result(value)

    await client.observe(key, handler)
    await client.set(key, b"ping")
    assert await asyncio.wait_for(done, 5) == b"ping"


async def test_broker_restart_while_observing(
    store_backend: StoreBackend, connect: Callable[..., asyncio.Future[StateStoreClient]]
) -> None:
    client = await connect()
    key, other = unique(), unique("unchanged")
    changes = Changes()
    await client.observe(key, changes)
    await client.set(other, b"same")
    await client.observe(other, changes)

    await store_backend.broker_down()
    # Changed while the client was away: its notification is lost with the connection.
    store_backend.write_directly(key, b"set-while-away")
    await store_backend.broker_up()

    change = await changes.next(within=10)
    assert (change.key, change.kind, change.value) == (key, "SET", b"set-while-away")
    assert change.synthetic and change.version is not None
    # Nothing before the catch-up's reading is known to be delivered any more.
    assert client.delivered_since(key) == change.version
    # Registrations are back: a live change arrives as a notification.
    await client.set(key, b"after")
    change = await changes.next()
    assert (change.value, change.synthetic) == (b"after", False)
    assert changes.queue.empty()  # nothing for the unchanged key


async def test_a_burst_of_changes_reaches_a_busy_handler_as_its_newest(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    watcher, writer = await connect("watcher"), await connect("writer")
    key = unique()
    seen: list[bytes | None] = []
    busy, release = asyncio.Event(), asyncio.Event()

    async def slow_handler(change: KeyChange) -> None:
        seen.append(change.value)
        busy.set()
        await release.wait()

    await watcher.observe(key, slow_handler)
    await writer.set(key, b"0")
    await asyncio.wait_for(busy.wait(), 5)
    last = None
    for value in range(1, 21):
        last = (await writer.set(key, str(value))).version
    await watcher.get(key)  # a round trip: every notification is in by now
    busy.clear()
    release.set()
    await asyncio.wait_for(busy.wait(), 5)
    assert seen == [b"0", b"20"]
    assert watcher._undelivered == {} and last is not None


async def test_a_delete_is_not_superseded_by_a_set_after_it(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    """A lease that ran out, then our own SET taking the lock, both before the handler ran:
    the DELETE was superseded by the SET, and the instance never learnt that the former
    lease had ended (it waited out a whole TTL more: the point-to-point soak's 1.99 s
    without an active at TTL 1 s)."""
    watcher, writer = await connect("watcher"), await connect("writer")
    key = unique()
    seen: list[tuple[str, bytes | None]] = []
    busy, release = asyncio.Event(), asyncio.Event()

    async def slow_handler(change: KeyChange) -> None:
        seen.append((change.kind, change.value))
        busy.set()
        await release.wait()

    await watcher.observe(key, slow_handler)
    await writer.set(key, b"former")
    await asyncio.wait_for(busy.wait(), 5)
    await writer.delete(key)
    for value in (b"ours", b"ours again"):
        await writer.set(key, value)
    await watcher.get(key)  # a round trip: every notification is in by now
    release.set()
    while len(seen) < 3:
        busy.clear()
        await asyncio.wait_for(busy.wait(), 5)
    assert seen == [("SET", b"former"), ("DELETE", None), ("SET", b"ours again")]
    assert watcher._undelivered == {}


async def test_what_came_before_a_change_is_heard_once_it_is_handed_over(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    """A switchover to c, then the lock's release, while the standby b's deliveries lagged
    behind a busy handler: the release took the turn of a renewal queued before the
    switchover, and b contended before hearing of the switchover (it took the line, not c).
    What b decides on the release waits for what was queued before it (handed_over)."""
    watcher, writer = await connect("watcher"), await connect("writer")
    busy_key, lock, device, switchover = unique(), unique(), unique(), unique()
    busy, release = asyncio.Event(), asyncio.Event()
    heard: list[bytes | None] = []
    request: list[bytes | None] = [None]
    decided = asyncio.get_running_loop().create_future()

    async def busy_handler(change: KeyChange) -> None:
        busy.set()
        await release.wait()

    async def decide() -> None:  # what the standby does on the release, as a task
        assert await watcher.handed_over(timeout=5)
        decided.set_result(request[0])

    deciding: list[asyncio.Task[None]] = []

    def lock_handler(change: KeyChange) -> None:
        if change.kind == "DELETE":
            deciding.append(asyncio.ensure_future(decide()))

    async def device_handler(change: KeyChange) -> None:
        heard.append(change.value)
        await asyncio.sleep(0)  # a handler that yields, between the two

    def switchover_handler(change: KeyChange) -> None:
        request[0] = change.value

    for key, handler in (
        (busy_key, busy_handler),
        (lock, lock_handler),
        (device, device_handler),
        (switchover, switchover_handler),
    ):
        await watcher.observe(key, handler)
    await writer.set(busy_key, b"1")
    await asyncio.wait_for(busy.wait(), 5)  # deliveries held up from here
    await writer.set(lock, b"a")  # a renewal
    await writer.set(device, b"21.0")
    await writer.set(switchover, b"to c")
    await writer.delete(lock)  # takes the renewal's turn, before the switchover's
    await watcher.get(lock)  # a round trip: every notification is in by now
    release.set()
    assert await asyncio.wait_for(decided, 5) == b"to c"
    assert heard == [b"21.0"]


async def test_delivered_since_tells_from_which_version_no_change_was_missed(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    """What a takeover needs to trust what it saw of a key (a publish it never saw there
    never reached the store): changes before the watch began were missed; changes
    superseded before delivery come with the change that took their place, up to a bound
    (a soak's takeover lost a panel change when they were dropped)."""
    watcher, writer = await connect("watcher"), await connect("writer")
    key = unique()
    first = await writer.set(key, b"0")
    busy, release = asyncio.Event(), asyncio.Event()

    delivered: list[KeyChange] = []

    async def slow_handler(change: KeyChange) -> None:
        delivered.append(change)
        busy.set()
        await release.wait()

    assert watcher.delivered_since(key) is None  # not watched
    await watcher.observe(key, slow_handler)
    assert watcher.delivered_since(key) == first.version
    await writer.set(key, b"1")
    await asyncio.wait_for(busy.wait(), 5)  # the handler holds "1"
    superseded = await writer.set(key, b"2")
    queued = await writer.set(key, b"3")
    await watcher.get(key)  # a round trip: every notification is in by now
    assert watcher.delivered_since(key) == queued.version  # "3" is not delivered yet
    busy.clear()
    release.set()
    await asyncio.wait_for(busy.wait(), 5)  # "3" reaches the handler, carrying "2"
    assert delivered[-1].earlier == ((b"2", superseded.version),)
    assert watcher.delivered_since(key) == first.version  # nothing missed
    # A burst longer than a change carries: the oldest are missed.
    busy.clear()
    release.clear()
    await writer.set(key, b"4")
    await asyncio.wait_for(busy.wait(), 5)  # the handler holds "4"
    burst = [await writer.set(key, b"%d" % n) for n in range(5, 7 + EARLIER_KEPT)]
    await watcher.get(key)
    busy.clear()
    release.set()
    await asyncio.wait_for(busy.wait(), 5)
    assert [value for value, _ in delivered[-1].earlier] == [
        b"%d" % n for n in range(6, 6 + EARLIER_KEPT)
    ] and delivered[-1].value == b"%d" % (6 + EARLIER_KEPT)
    assert watcher.delivered_since(key) == burst[0].version
    await watcher.unobserve(key)
    assert watcher.delivered_since(key) is None


async def test_an_absent_key_is_watched_whole_from_its_registration(
    store_backend: StoreBackend, connect: Callable[..., asyncio.Future[StateStoreClient]]
) -> None:
    """A key the store does not hold has no version to count from, but every change after
    the registration is newer than the service's clock at it: a takeover can still say that
    a publish it never saw never reached the store. (A soak lost a panel change when the
    store had restarted without its contents and the standby, caught up on absent keys,
    could not say: it believed the former active's mark of a publish the store refused.)"""
    watcher, writer = await connect("watcher"), await connect("writer")
    key = unique()
    changes = Changes()
    await watcher.observe(key, changes)
    since = watcher.delivered_since(key)
    assert since is not None
    assert (await writer.set(key, b"1")).version > since
    await changes.next(within=5)

    # The same after a reconnect that finds the key gone.
    await store_backend.broker_down()
    store_backend.delete_directly(key)
    await store_backend.broker_up()
    change = await changes.next(within=10)  # the catch-up found it gone
    assert (change.kind, change.synthetic) == ("DELETE", True)
    since_back = watcher.delivered_since(key)
    assert since_back is not None and since_back > since
    assert (await watcher.set(key, b"2")).version > since_back  # back, caught up: connected


async def test_catch_up_survives_an_unexpected_error_and_keys_stay_watched(
    store_backend: StoreBackend,
    connect: Callable[..., asyncio.Future[StateStoreClient]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = await connect()
    key = unique()
    changes = Changes()
    await client.observe(key, changes)
    real_get = client.get
    failures = 0

    async def get_failing_once(*args: object, **kwargs: object) -> object:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise RuntimeError("a bug in the catch-up path")
        return await real_get(*args, **kwargs)  # type: ignore[arg-type]

    client.get = get_failing_once  # type: ignore[method-assign]
    await store_backend.broker_down()
    store_backend.write_directly(key, b"set-while-away")
    await store_backend.broker_up()
    change = await changes.next(within=10)
    assert (change.value, change.synthetic) == (b"set-while-away", True)
    assert failures == 1
    assert any("re-registering" in r.getMessage() for r in caplog.records)
    await client.set(key, b"live")  # registered again: a live notification
    assert (await changes.next()).value == b"live"


async def test_catch_up_reads_a_few_keys_at_a_time_and_misses_none(
    store_backend: StoreBackend, connect: Callable[..., asyncio.Future[StateStoreClient]]
) -> None:
    client = await connect()
    keys = [unique() for _ in range(40)]
    changes = Changes()
    for key in keys:
        await client.observe(key, changes)
    real_get = client.get
    reading = most = 0

    async def counted_get(*args: object, **kwargs: object) -> object:
        nonlocal reading, most
        reading += 1
        most = max(most, reading)
        try:
            return await real_get(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            reading -= 1

    client.get = counted_get  # type: ignore[method-assign]
    await store_backend.broker_down()
    for key in keys:
        store_backend.write_directly(key, b"set-while-away")
    await store_backend.broker_up()
    seen = {(await changes.next(within=10)).key for _ in keys}
    assert seen == set(keys)
    assert 1 < most <= statestore._CATCH_UP_IN_FLIGHT


async def test_a_closed_client_does_nothing_on_reconnect(
    store_backend: StoreBackend,
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    client = await connect()
    await client.observe(unique(), Changes())
    session = client.session
    await client.close()
    await store_backend.broker_down()
    await store_backend.broker_up()
    await session.wait_connected(timeout=10)
    for _ in range(3):  # the on-connect hooks have run by the time it counts as connected
        await asyncio.sleep(0)
    assert client._resync_task is None


async def test_not_connected_fails_fast(
    store_backend: StoreBackend, connect: Callable[..., asyncio.Future[StateStoreClient]]
) -> None:
    client = await connect()
    gone = asyncio.Event()
    client.session.on_disconnect(gone.set)
    await store_backend.broker_down()
    await asyncio.wait_for(gone.wait(), 10)
    started = time.monotonic()
    with pytest.raises(NotConnected):
        await client.get(b"k")
    assert time.monotonic() - started < 1
    await store_backend.broker_up()


async def test_request_timeout(connect: Callable[..., asyncio.Future[StateStoreClient]]) -> None:
    client = await connect()
    # Nobody answers on a response topic we are not subscribed to.
    client._response_topic = "nobody/listens/here"
    with pytest.raises(errors.RequestTimeout):
        await client.get(b"k", timeout=0.3)
    assert not client._pending


async def test_200_concurrent_requests(
    connect: Callable[..., asyncio.Future[StateStoreClient]],
) -> None:
    client = await connect()
    key = unique()
    results = await asyncio.gather(*(client.set(key + b"-%d" % i, b"%d" % i) for i in range(200)))
    assert all(r.applied for r in results)
    values = await asyncio.gather(*(client.get(key + b"-%d" % i) for i in range(200)))
    assert [v for v, _ in values] == [b"%d" % i for i in range(200)]
