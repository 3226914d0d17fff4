"""The MQTT session's connecting, against real brokers: mosquitto, and raw listeners for
what mosquitto will not do (refuse MQTT 5, never answer CONNECT): retries and timeouts of
the first connect, refusals that are fatal, keep-alive, credentials, and a stop at any
moment of an attempt."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.client.session import (
    AuthenticationFailed,
    NotConnected,
    ProtocolVersionRefused,
    PublishFailed,
    Session,
    SessionTimeout,
)
from tests.client.conftest import (
    ConfiguredMosquitto,
    Inbox,
    LogWatch,
    RawBrokerFactory,
    fast_settings,
    started,
    unique,
)
from tests.support.mosquitto import Mosquitto
from tests.support.ports import free_port

# MQTT 5 CONNACK: flags 0, reason 0x84 "unsupported protocol version", no properties.
CONNACK_V5_UNSUPPORTED = bytes([0x20, 0x03, 0x00, 0x84, 0x00])
# What a 3.1.1-only broker answers an MQTT 5 CONNECT: return code 1.
CONNACK_V311_UNACCEPTABLE = bytes([0x20, 0x02, 0x00, 0x01])


async def test_first_connect_retries_until_the_broker_starts(log_watch: LogWatch) -> None:
    broker = Mosquitto(port=free_port())  # not started yet
    session = Session(fast_settings(broker.port, connect_timeout_s=1.0), client_id=unique())
    starting = asyncio.create_task(session.start(timeout=10))
    try:
        await log_watch.wait_for("could not connect")
        assert not starting.done()
        await asyncio.to_thread(broker.start)
        await asyncio.wait_for(starting, 10)
        assert session.connected
        await session.publish("first/connect", b"ok")
        # Every retry was announced with a delay within the configured bounds.
        for record in log_watch.matching("could not connect"):
            assert isinstance(record.args, tuple)
            delay = record.args[-1]
            assert isinstance(delay, float) and 0.0 <= delay <= 0.2
    finally:
        await session.stop()
        broker.stop()


async def test_start_times_out_with_a_clear_error_when_no_broker_comes() -> None:
    port = free_port()
    session = Session(fast_settings(port), client_id=unique())
    started_at = time.monotonic()
    with pytest.raises(SessionTimeout) as raised:
        await session.start(timeout=0.5)
    assert time.monotonic() - started_at < 2
    message = str(raised.value)
    assert f"127.0.0.1:{port}" in message and "within 0.5 s" in message
    assert "connection refused" in message
    assert isinstance(raised.value, TimeoutError)
    await asyncio.wait_for(session.wait_closed(), 1)  # a failed start leaves it stopped
    with pytest.raises(NotConnected):
        await session.publish("x", b"y")


async def test_each_attempt_times_out_without_connack_and_is_retried(
    raw_broker: RawBrokerFactory,
) -> None:
    broker = await raw_broker(None)  # accepts, reads CONNECT, never answers
    settings = fast_settings(
        broker.port, connect_timeout_s=0.3, reconnect_min_s=0.01, reconnect_max_s=0.02
    )
    session = Session(settings, client_id=unique())
    with pytest.raises(SessionTimeout, match=r"no CONNACK within 0\.3 s"):
        # Room for three attempts on a loaded machine (one quiet run of the suite saw two in
        # 2.5 s: each attempt's connect, and the broker's read of its CONNECT, came late).
        await session.start(timeout=5)
    attempts = len(broker.connects)
    assert attempts >= 3
    # Each attempt waited out its 0.3 s: at most one an attempt's timeout in the 5 s (a
    # retry at once would come after the 10-20 ms backoff, a hundred of them). Counted, not
    # timed on the broker's clock, which sees each CONNECT as late as a loaded loop reads it
    # (0.18 s was seen between two attempts 0.3 s apart).
    assert attempts <= 5 / 0.3 + 1, attempts
    # The client hung up every half-open connection it gave up on (the broker may read the
    # last attempt's CONNECT only now, on a loaded machine: each read one counts).
    await broker.wait_for(lambda: broker.closed_by_client == len(broker.connects))


async def test_stop_while_start_waits(raw_broker: RawBrokerFactory) -> None:
    broker = await raw_broker(None)
    session = Session(fast_settings(broker.port), client_id=unique())
    starting = asyncio.create_task(session.start(timeout=10))
    await broker.wait_for(lambda: len(broker.connects) == 1)
    await session.stop()
    with pytest.raises(NotConnected, match="stopped before it connected"):
        await starting
    await broker.wait_for(lambda: broker.closed_by_client == 1)


async def test_mqtt5_refused_with_connack_0x84_is_fatal(raw_broker: RawBrokerFactory) -> None:
    broker = await raw_broker(CONNACK_V5_UNSUPPORTED)
    session = Session(fast_settings(broker.port), client_id=unique())
    with pytest.raises(ProtocolVersionRefused, match="MQTT 5") as raised:
        await session.start(timeout=5)
    assert raised.value.reason_code == 0x84 and raised.value.fatal
    assert session.error is raised.value
    assert [c.protocol_level for c in broker.connects] == [5]  # no retry, no 3.1.1 fallback


async def test_mqtt5_refused_by_a_311_broker_is_fatal_without_fallback(
    raw_broker: RawBrokerFactory,
) -> None:
    broker = await raw_broker(CONNACK_V311_UNACCEPTABLE)
    session = Session(fast_settings(broker.port), client_id=unique())
    with pytest.raises(ProtocolVersionRefused, match=r"does not fall back to MQTT 3\.1\.1"):
        await session.start(timeout=5)
    # gmqtt would silently reconnect with protocol level 4; the session refuses.
    assert [c.protocol_level for c in broker.connects] == [5]
    with pytest.raises(ProtocolVersionRefused):
        await session.wait_closed()


@pytest.mark.parametrize(("keepalive", "expected"), [(None, 10), (3, 3)])
async def test_keepalive_in_connect(
    raw_broker: RawBrokerFactory, keepalive: int | None, expected: int
) -> None:
    broker = await raw_broker(None)
    overrides = {} if keepalive is None else {"keepalive_s": keepalive}
    session = Session(fast_settings(broker.port, **overrides), client_id=unique())
    await session.start(wait=False)
    try:
        await broker.wait_for(lambda: len(broker.connects) >= 1)
    finally:
        await session.stop()
    connect = broker.connects[0]
    assert connect.keepalive == expected
    assert connect.protocol_level == 5 and connect.clean_start and not connect.has_username


AUTH_CONFIG = """\
listener {{port}} 127.0.0.1
allow_anonymous false
password_file {passwords}
acl_file {acl}
persistence false
log_dest stderr
"""


ACL = "user agent\ntopic readwrite ok/#\ntopic read readonly/#\n"


PASSWORD = "s3cret-Pa55"


@pytest.fixture
def auth_mosquitto(
    tmp_path: Path, configured_mosquitto: Callable[[str], ConfiguredMosquitto]
) -> ConfiguredMosquitto:
    tool = shutil.which("mosquitto_passwd")
    if tool is None:
        pytest.skip("mosquitto_passwd is not installed (Debian package mosquitto)")
    passwords, acl = tmp_path / "passwords", tmp_path / "acl"
    subprocess.run([tool, "-b", "-c", str(passwords), "agent", PASSWORD], check=True, timeout=10)
    acl.write_text(ACL)
    return configured_mosquitto(AUTH_CONFIG.format(passwords=passwords, acl=acl))


async def test_username_and_password(
    auth_mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = fast_settings(auth_mosquitto.port, username="agent", password=PASSWORD)
    session = await started(settings)
    try:
        inbox = Inbox()
        await session.subscribe("ok/#", inbox)
        await session.publish("ok/1", b"authorised")
        assert (await inbox.get()).payload == b"authorised"

        with pytest.raises(PublishFailed) as refused:
            await session.publish("readonly/1", b"x")
        assert refused.value.reason_code == 0x87  # not authorized
    finally:
        await session.stop()
    assert PASSWORD not in caplog.text
    assert PASSWORD not in repr(settings)


@pytest.mark.parametrize(
    "credentials", [{"username": "agent", "password": "wrong"}, {"username": "nobody"}, {}]
)
async def test_bad_credentials_are_fatal(
    auth_mosquitto: Mosquitto, credentials: dict[str, str]
) -> None:
    session = Session(fast_settings(auth_mosquitto.port, **credentials))
    started_at = time.monotonic()
    with pytest.raises(AuthenticationFailed, match="credentials") as raised:
        await session.start(timeout=5)
    assert raised.value.reason_code in (0x86, 0x87) and raised.value.fatal
    assert time.monotonic() - started_at < 2  # refused at once, not retried until the timeout


async def test_a_session_stopped_while_it_connects_ends_quietly() -> None:
    """An agent is ready before it is connected, so a stop may come at any moment of a
    connection attempt. Stopped between TCP's connect and gmqtt's use of it, gmqtt's protocol
    raised from the event loop's callbacks ('NoneType' object has no attribute
    'put_package', then 'is_closing'). Each moment of an attempt, one loop turn apart."""
    loop = asyncio.get_running_loop()
    raised: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: raised.append(context))

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(1)  # reads nothing, answers nothing
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for turns in range(16):
            session = Session(fast_settings(port))
            await session.start(wait=False)
            for _ in range(turns):
                await asyncio.sleep(0)
            await session.stop()
            for _ in range(5):  # what the close schedules runs a few turns later
                await asyncio.sleep(0)
            assert raised == [], f"stopped {turns} turns into the attempt: {raised}"
        await asyncio.sleep(0.05)  # and a task that failed unseen is reported by now
        assert raised == []
    finally:
        loop.set_exception_handler(None)
        server.close()
