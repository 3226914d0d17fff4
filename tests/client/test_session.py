"""The MQTT session layer once connected, against real brokers: mosquitto, and raw listeners
for what mosquitto will not do: reconnects and their hooks, publishing in and out of the
in-flight window, subscriptions and their handlers, and stopping (connecting itself:
test_session_connect.py)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid

import pytest

from agent.client.session import (
    Message,
    NotConnected,
    Session,
    SessionTimeout,
    SubscribeFailed,
)
from agent.config import MqttSettings
from tests.client.conftest import (
    Inbox,
    LogWatch,
    RawBrokerFactory,
    fast_settings,
    started,
    unique,
)
from tests.support.mosquitto import Mosquitto

# MQTT 5 CONNACK: success, no properties (so Receive Maximum is the default 65535).
CONNACK_SUCCESS = bytes([0x20, 0x03, 0x00, 0x00, 0x00])


# --- Settings ---------------------------------------------------------------------------------


def test_client_id_comes_from_the_argument_then_the_settings_then_is_unique() -> None:
    settings = MqttSettings(client_id="from-settings")
    assert Session(settings, client_id="explicit").client_id == "explicit"
    assert Session(settings).client_id == "from-settings"
    one, two = Session(MqttSettings()), Session(MqttSettings())
    assert one.client_id != two.client_id
    with pytest.raises(ValueError):
        Session(MqttSettings(), client_id="a/b")


# --- Against mosquitto -----------------------------------------------------------------------


async def test_round_trip_keeps_every_property(mosquitto: Mosquitto) -> None:
    session = await started(fast_settings(mosquitto.port))
    try:
        inbox = Inbox()
        await session.subscribe("props/+", inbox)
        user_properties = [("name", "1"), ("name", "2"), ("other", "ünïcode"), ("name", "3")]
        await session.publish(
            "props/x",
            b"\x00\xffpayload",
            response_topic="props-reply/x",
            correlation_data=b"\x00\x01\xfe\xff",
            content_type="application/octet-stream",
            message_expiry_interval=120,
            user_properties=user_properties,
            timeout=5,
        )
        message = await inbox.get()
        assert message.topic == "props/x"
        assert message.payload == b"\x00\xffpayload"
        assert message.qos == 1 and message.retain is False
        assert message.response_topic == "props-reply/x"
        assert message.correlation_data == b"\x00\x01\xfe\xff"
        assert message.content_type == "application/octet-stream"
        # The broker may count the expiry down by the time the message spent with it.
        assert message.message_expiry_interval in (119, 120)
        assert message.user_properties == user_properties
        assert message.user_property("name") == "1"

        await session.publish("props/y", b"", qos=0)
        bare = await inbox.get()
        assert (bare.payload, bare.qos, bare.response_topic, bare.user_properties) == (
            b"",
            0,
            None,
            [],
        )
    finally:
        await session.stop()


async def test_resubscribes_and_runs_hooks_in_order_after_a_broker_restart(
    mosquitto: Mosquitto,
) -> None:
    session = Session(fast_settings(mosquitto.port), client_id=unique())
    inbox = Inbox()
    events: list[str] = []
    hooks_done = asyncio.Event()
    disconnected = asyncio.Event()

    async def first_hook() -> None:
        events.append(f"hook1 connected={session.connected}")
        # Delivered only if the subscription was SUBACKed before this hook ran: the restarted
        # broker (no persistence) has forgotten every subscription.
        await session.publish("restart/hook", b"from-hook1")

    async def second_hook() -> None:
        events.append("hook2")
        hooks_done.set()

    def on_disconnect() -> None:
        events.append("disconnected")
        disconnected.set()

    await session.subscribe("restart/#", inbox)  # before start: made by the first connect
    session.on_connect(first_hook)
    session.on_connect(second_hook)
    session.on_disconnect(on_disconnect)
    await session.start(timeout=5)
    try:
        assert events == ["hook1 connected=True", "hook2"]
        assert (await inbox.get()).payload == b"from-hook1"

        events.clear()
        hooks_done.clear()
        await asyncio.to_thread(mosquitto.restart)
        back_at = time.monotonic()
        await asyncio.wait_for(hooks_done.wait(), 5)
        # Backoff between 0.05 and 0.2 s: back within a few attempts once the broker is (the
        # bound leaves a loaded machine slack; the default backoff would be tens of seconds).
        assert time.monotonic() - back_at < 3.0
        assert disconnected.is_set()
        assert events == ["disconnected", "hook1 connected=True", "hook2"]
        assert (await inbox.get()).payload == b"from-hook1"

        other = await started(fast_settings(mosquitto.port))
        try:
            await other.publish("restart/from-other", b"hello")
        finally:
            await other.stop()
        assert (await inbox.get()).topic == "restart/from-other"
    finally:
        await session.stop()


async def test_200_concurrent_qos1_publishes_through_receive_maximum_20(
    mosquitto: Mosquitto,
) -> None:
    session = await started(fast_settings(mosquitto.port))
    try:
        # mosquitto's default max_inflight_messages is 20, sent as Receive Maximum in CONNACK.
        assert session.inflight_limit is not None and session.inflight_limit < 20
        received: set[bytes] = set()
        all_received = asyncio.Event()

        def count(message: Message) -> None:
            received.add(message.payload)
            if len(received) == 200:
                all_received.set()

        await session.subscribe("load/+", count)
        results = await asyncio.gather(
            *(session.publish(f"load/{i % 7}", str(i).encode(), timeout=10) for i in range(200))
        )
        assert results == [None] * 200
        await asyncio.wait_for(all_received.wait(), 5)
    finally:
        await session.stop()


async def test_publish_while_disconnected(mosquitto: Mosquitto) -> None:
    session = await started(fast_settings(mosquitto.port))
    inbox = Inbox()
    await session.subscribe("offline/#", inbox)
    down = asyncio.Event()
    session.on_disconnect(down.set)
    try:
        await asyncio.to_thread(mosquitto.stop)
        await asyncio.wait_for(down.wait(), 5)
        assert not session.connected

        began = time.monotonic()
        with pytest.raises(NotConnected):
            await session.publish("offline/now", b"x", timeout=5)
        assert time.monotonic() - began < 2.5  # at once, not after the 5 s timeout

        with pytest.raises(SessionTimeout, match="no connection"):
            await session.publish("offline/late", b"x", timeout=0.2, wait_connected=True)

        pending = asyncio.create_task(
            session.publish("offline/queued", b"sent later", timeout=10, wait_connected=True)
        )
        await asyncio.to_thread(mosquitto.start)
        await asyncio.wait_for(pending, 10)
        message = await inbox.get()
        assert (message.topic, message.payload) == ("offline/queued", b"sent later")
    finally:
        await session.stop()


async def test_publish_in_flight_when_the_link_drops_fails_with_not_connected(
    raw_broker: RawBrokerFactory,
) -> None:
    # CONNACK success (Receive Maximum default), then never a PUBACK; the test drops the link.
    broker = await raw_broker(CONNACK_SUCCESS)
    session = await started(fast_settings(broker.port, reconnect_min_s=5, reconnect_max_s=5))
    try:
        publishing = asyncio.create_task(session.publish("x", b"y", timeout=5))
        await asyncio.sleep(0)  # let it send
        await broker.stop()
        with pytest.raises(NotConnected, match="before the acknowledgement"):
            await publishing
    finally:
        await session.stop()


async def test_window_stays_taken_until_the_puback_even_after_a_timeout(
    raw_broker: RawBrokerFactory,
) -> None:
    # CONNACK with Receive Maximum 3 (property 0x21); the raw broker never sends a PUBACK.
    broker = await raw_broker(bytes([0x20, 0x06, 0x00, 0x00, 0x03, 0x21, 0x00, 0x03]))
    session = await started(fast_settings(broker.port))
    try:
        # gmqtt's packet id pool holds Receive Maximum - 1 ids.
        assert session.inflight_limit == 2
        for _ in range(2):
            with pytest.raises(SessionTimeout, match=r"no PUBACK within 0\.1 s"):
                await session.publish("w/x", b"1", timeout=0.1)
        # The two unacknowledged publishes still hold the window: the broker has them.
        with pytest.raises(SessionTimeout, match="no room in the in-flight window"):
            await session.publish("w/x", b"3", timeout=0.1)
        await session.publish("w/x", b"qos0", qos=0, timeout=0.1)  # QoS 0 takes no packet id
    finally:
        await session.stop()


class _WorstCaseRandom(random.Random):
    """Always draws the longest delay the backoff allows."""

    def uniform(self, a: float, b: float) -> float:
        return b


async def test_reconnect_ceiling_bounds_every_reconnect_delay(
    raw_broker: RawBrokerFactory, log_watch: LogWatch
) -> None:
    # A lease holder cannot afford the ordinary backoff (here a certain 2 s and more).
    broker = await raw_broker(CONNACK_SUCCESS)
    settings = fast_settings(broker.port, reconnect_min_s=2.0, reconnect_max_s=30.0)
    session = Session(settings, client_id=unique(), rng=_WorstCaseRandom())
    await session.start(timeout=5)
    try:
        session.set_reconnect_ceiling(0.1)
        for drops in range(1, 4):
            await session.wait_connected(timeout=1)
            dropped_at = time.monotonic()
            broker.drop_clients()
            await broker.wait_for(lambda n=drops: len(broker.connects) == n + 1, within=1.5)
            assert broker.connects[-1].at - dropped_at < 0.5
        await session.wait_connected(timeout=1)
        session.set_reconnect_ceiling(None)  # back to the ordinary backoff
        log_watch.records.clear()
        broker.drop_clients()
        record = await log_watch.wait_for("reconnects in")
        assert float(record.getMessage().split("reconnects in ")[1].split()[0]) >= 2.0
    finally:
        await session.stop()


async def test_session_taken_over_is_reported(
    raw_broker: RawBrokerFactory, log_watch: LogWatch
) -> None:
    # What a broker sends the older of two clients with the same client id: DISCONNECT 0x8E.
    # (mosquitto 2.0.11 just closes the socket.)
    broker = await raw_broker(CONNACK_SUCCESS, publish_reply=bytes([0xE0, 0x01, 0x8E]))
    session = await started(fast_settings(broker.port))
    try:
        await session.publish("x", b"y", qos=0)
        record = await log_watch.wait_for("another client connected with the same client id")
        assert record.levelno == logging.WARNING and session.client_id in record.getMessage()
    finally:
        await session.stop()


async def test_a_lost_connection_is_one_line_saying_why(
    raw_broker: RawBrokerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    broker = await raw_broker(CONNACK_SUCCESS)
    session = await started(fast_settings(broker.port))
    try:
        # Unread data at the broker when it drops the connection: a reset, not a clean close.
        await session.publish("x", b"y" * 200_000, qos=0)
        broker.drop_clients()
        await broker.wait_for(lambda: len(broker.connects) == 2)
    finally:
        await session.stop()
    lost = [r for r in caplog.records if "lost its connection" in r.getMessage()]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING
    assert "Connection reset by peer" in lost[0].getMessage()
    # Not also gmqtt's traceback of the same reset.
    assert not [r for r in caplog.records if "CONN LOST" in r.getMessage() or r.exc_info]


async def test_refused_subscription_raises_and_is_not_kept(raw_broker: RawBrokerFactory) -> None:
    # mosquitto's ACL grants every SUBSCRIBE (it checks read access on delivery), so a raw
    # broker plays one that refuses: SUBACK 0x87 "not authorized".
    broker = await raw_broker(CONNACK_SUCCESS, 0x87)
    session = await started(fast_settings(broker.port))
    try:
        with pytest.raises(SubscribeFailed, match="0x87") as raised:
            await session.subscribe("secret/#", Inbox())
        assert raised.value.reason_code == 0x87 and raised.value.topic_filter == "secret/#"
        # Not re-subscribed after a reconnect.
        broker.drop_clients()
        await broker.wait_for(lambda: len(broker.connects) == 2)
        await session.wait_connected(5)
        assert broker.subscribed == ["secret/#"]
    finally:
        await session.stop()


async def test_handler_awaiting_a_round_trip_through_the_same_session(
    mosquitto: Mosquitto,
) -> None:
    session = await started(fast_settings(mosquitto.port))
    try:
        waiting: dict[bytes, asyncio.Future[bytes]] = {}
        late = Inbox()
        outcome: asyncio.Future[tuple[bytes, bytes]] = asyncio.get_running_loop().create_future()

        def on_response(message: Message) -> None:  # sync: runs as the packet is read
            assert message.correlation_data is not None
            waiting.pop(message.correlation_data).set_result(message.payload)

        async def service(message: Message) -> None:  # another async handler answers
            assert message.response_topic is not None
            await session.publish(
                message.response_topic,
                b"pong:" + message.payload,
                correlation_data=message.correlation_data,
            )

        async def request(payload: bytes) -> bytes:
            correlation = uuid.uuid4().bytes
            # Registered before sending: the response may well arrive before our PUBACK.
            response = waiting[correlation] = asyncio.get_running_loop().create_future()
            await session.publish(
                "rt/service", payload, response_topic="rt/response", correlation_data=correlation
            )
            return await asyncio.wait_for(response, 5)

        async def on_trigger(message: Message) -> None:
            try:
                answer = await request(message.payload)
                # A subscribe/publish round trip from inside a handler, too.
                await session.subscribe("rt/late", late)
                await session.publish("rt/late", b"late")
                outcome.set_result((answer, (await late.get()).payload))
            except Exception as exc:  # report it instead of letting the session log it
                outcome.set_exception(exc)

        await session.subscribe("rt/response", on_response)
        await session.subscribe("rt/service", service)
        await session.subscribe("rt/trigger", on_trigger)
        await session.publish("rt/trigger", b"ping")
        assert await asyncio.wait_for(outcome, 5) == (b"pong:ping", b"late")
    finally:
        await session.stop()


async def test_async_handler_gets_messages_in_order(mosquitto: Mosquitto) -> None:
    session = await started(fast_settings(mosquitto.port))
    try:
        seen: list[int] = []
        done = asyncio.Event()

        async def slow(message: Message) -> None:
            await asyncio.sleep(0.001 * (int(message.payload) % 3))  # interleaving bait
            seen.append(int(message.payload))
            if len(seen) == 50:
                done.set()

        await session.subscribe("order/x", slow)
        for i in range(50):
            await session.publish("order/x", str(i).encode())
        await asyncio.wait_for(done.wait(), 5)
        assert seen == list(range(50))
    finally:
        await session.stop()


async def test_a_handler_that_falls_behind_loses_its_oldest_messages(
    mosquitto: Mosquitto, log_watch: LogWatch
) -> None:
    session = Session(fast_settings(mosquitto.port), client_id=unique(), handler_queue_limit=5)
    await session.start(timeout=5)
    try:
        release = asyncio.Event()
        handled: list[int] = []
        done = asyncio.Event()

        async def stuck(message: Message) -> None:
            await release.wait()
            handled.append(int(message.payload))
            if len(handled) == 6:
                done.set()

        arrived = Inbox()  # a plain handler: it sees each message as it is read
        await session.subscribe("behind/x", stuck)
        await session.subscribe("behind/x", arrived)
        for i in range(9):
            await session.publish("behind/x", str(i).encode())
        for _ in range(9):
            await arrived.get()
        # Message 0 is in the handler's hands; the queue holds 5, the newest: 4 to 8.
        assert session.dropped_messages == 3
        warning = await log_watch.wait_for("dropping the oldest")
        assert warning.levelno == logging.WARNING and "5 messages behind" in warning.getMessage()
        assert len(log_watch.matching("dropping the oldest")) == 1  # once per backlog
        release.set()
        await asyncio.wait_for(done.wait(), 5)
        assert handled == [0, 4, 5, 6, 7, 8]
        await log_watch.wait_for("caught up, having lost 3 messages")

        # A new backlog is reported again.
        release.clear()
        for i in range(9, 16):
            await session.publish("behind/x", str(i).encode())
        for _ in range(7):
            await arrived.get()
        assert session.dropped_messages == 4
        assert len(log_watch.matching("dropping the oldest")) == 2
    finally:
        await session.stop()


def test_the_handler_queue_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="handler_queue_limit"):
        Session(MqttSettings(), handler_queue_limit=0)


async def test_unsubscribe_and_handler_errors(mosquitto: Mosquitto, log_watch: LogWatch) -> None:
    session = await started(fast_settings(mosquitto.port))
    try:
        specific, wildcard = Inbox(), Inbox()

        def broken(message: Message) -> None:
            raise RuntimeError("handler bug")

        await session.subscribe("unsub/a", specific)
        await session.subscribe("unsub/a", broken)
        await session.subscribe("unsub/+", wildcard)
        await session.publish("unsub/a", b"1")
        assert (await specific.get()).payload == b"1"
        assert (await wildcard.get()).payload == b"1"
        assert log_watch.matching("failed on a message to 'unsub/a'")

        await session.unsubscribe("unsub/a", broken)
        await session.unsubscribe("unsub/a")
        await session.publish("unsub/a", b"2")
        assert (await wildcard.get()).payload == b"2"
        assert specific.queue.empty()  # dispatch is synchronous: it would be there by now
    finally:
        await session.stop()


async def test_stop_disconnects_cleanly(mosquitto: Mosquitto) -> None:
    watcher = await started(fast_settings(mosquitto.port))
    broker_log = Inbox()
    await watcher.subscribe("$SYS/broker/log/#", broker_log)
    disconnects: list[str] = []
    async with Session(fast_settings(mosquitto.port), client_id=unique("stopper")) as session:
        session.on_disconnect(lambda: disconnects.append("down"))
        assert session.connected
    try:
        assert not session.connected and disconnects == ["down"]
        await asyncio.wait_for(session.wait_closed(), 1)
        with pytest.raises(NotConnected):
            await session.publish("x", b"y", wait_connected=True)
        # mosquitto logs "disconnected" for a DISCONNECT, "closed its connection" otherwise.
        while (
            f"Client {session.client_id} disconnected"
            not in (await broker_log.get()).payload.decode()
        ):
            pass
    finally:
        await watcher.stop()


# --- Credentials ------------------------------------------------------------------------------
