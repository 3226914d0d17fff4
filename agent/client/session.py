"""The MQTT 5 session every part of the agent shares, over gmqtt 0.8.

gmqtt speaks the protocol; this layer closes the gaps that matter for a long-running edge agent:

- Reconnection is driven here, not by gmqtt (whose fixed 6 s delay makes a fleet reconnect in
  lock-step): exponential backoff with full jitter, and the first connect is retried the same
  way. Every attempt (TCP, TLS, CONNACK) is bounded by ``connect_timeout_s``.
- After every CONNACK all subscriptions are made again and SUBACKed before the session counts
  as connected; then the on-connect hooks run, in registration order.
- QoS 1 ``publish()`` returns when the PUBACK arrives and raises on a failure reason code. An
  in-flight window (the broker's Receive Maximum, our own cap) keeps gmqtt from raising
  ``OverflowError`` and the broker from disconnecting us.
- Requests fail fast with ``NotConnected`` while the link is down, or wait for it within their
  own timeout (``wait_connected=True``); nothing is silently dropped.
- A broker that refuses MQTT 5 is a fatal ``ProtocolVersionRefused`` (gmqtt would silently fall
  back to 3.1.1 and lose every property), and so are bad credentials.
- Credentials: user name and password, a client certificate (``mqtt.tls``), or a Kubernetes
  service account token (MQTT 5 enhanced authentication, method K8S-SAT, ``mqtt.sat_file``),
  read anew for every connection so that a rotated token is used.

Each connection uses a fresh gmqtt client (``Link``): no state of a dead connection (packet
ids, subscription bookkeeping, a protocol downgrade) can leak into the next one. The session
always connects with Clean Start and no session expiry, so the broker keeps nothing between
connections and in-flight QoS 1 publishes fail with ``NotConnected`` when the link drops (the
caller decides whether to resend).

The concerns around it have modules of their own: ``session_errors`` (what it raises, CONNACK
classification), ``agent.backoff``, ``agent.protocol.mqtt_topics``, ``tls``, ``credentials``,
``gmqtt_client`` (everything gmqtt), ``link`` (opening one connection, and what is in
flight on it), ``handlers`` and ``subscriptions`` (what every connection subscribes to, and
which handlers a message goes to).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, TypeAlias

from agent.backoff import Backoff
from agent.client.credentials import exposed_secret, read_credentials
from agent.client.gmqtt_client import outgoing
from agent.client.handlers import DEFAULT_QUEUE_LIMIT, Handler, HandlerEntry
from agent.client.link import Link, open_link, wait_until
from agent.client.session_errors import (
    AuthenticationFailed,
    ConnectFailed,
    ConnectionRefused,
    NotConnected,
    ProtocolVersionRefused,
    PublishFailed,
    SessionError,
    SessionTimeout,
    SubscribeFailed,
    describe_connect_failure,
    disconnect_detail,
    is_definitive,
)
from agent.client.subscriptions import Subscriptions, send_subscribe
from agent.client.tls import TlsSetupFailed, build_ssl_context
from agent.config import MqttSettings, check_client_id, default_client_id
from agent.message import Message
from agent.protocol.mqtt_topics import validate_topic_filter, validate_topic_name

__all__ = [
    "AuthenticationFailed",
    "ConnectFailed",
    "ConnectionRefused",
    "Handler",
    "Message",
    "NotConnected",
    "ProtocolVersionRefused",
    "PublishFailed",
    "Session",
    "SessionError",
    "SessionTimeout",
    "SubscribeFailed",
    "TlsSetupFailed",
]

_log = logging.getLogger(__name__)

ConnectHook: TypeAlias = Callable[[], Awaitable[None]]
DisconnectHook: TypeAlias = Callable[[], None]

_BYTES_LIKE: Final = (bytes, bytearray, memoryview)


class Session:
    """An MQTT 5 session that stays connected until ``stop()``.

    ::

        async with Session(settings.mqtt, client_id=client_id) as session:
            await session.subscribe("a/+", on_message)
            await session.publish("a/b", b"payload", timeout=5)
    """

    def __init__(
        self,
        settings: MqttSettings,
        *,
        client_id: str | None = None,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
        rng: random.Random | None = None,
        handler_queue_limit: int = DEFAULT_QUEUE_LIMIT,
        will: Message | None = None,
    ) -> None:
        """``will``: the Last Will the broker publishes when a connection ends without a
        DISCONNECT (a crash, a lost network), sent in every CONNECT."""
        self._settings = settings
        if will is not None:
            validate_topic_name(will.topic)
        self._will = will
        if client_id is None:
            # Unique per instance even when nothing better is known; the agent passes one
            # derived from its device and instance ids.
            client_id = settings.client_id or default_client_id("session", uuid.uuid4().hex[:12])
        self._client_id = check_client_id(client_id)
        self._log = logger or _log
        self._backoff = Backoff(settings.reconnect_min_s, settings.reconnect_max_s, rng=rng)
        # A coroutine handler that falls this far behind loses its oldest messages (handlers.py).
        if handler_queue_limit < 1:
            raise ValueError("handler_queue_limit must be at least 1")
        self._handler_queue_limit = handler_queue_limit
        self._dropped = 0
        self._ssl = build_ssl_context(settings.tls)
        self._where = f"{settings.host}:{settings.port}"

        self._subscriptions = Subscriptions()
        self._connect_hooks: list[ConnectHook] = []
        self._disconnect_hooks: list[DisconnectHook] = []
        self._tasks: set[asyncio.Task[Any]] = set()

        self._supervisor: asyncio.Task[None] | None = None
        self._link: Link | None = None
        self._connected = False
        self._stopping = False
        self._error: SessionError | None = None
        self._last_error: BaseException | None = None
        # Set whenever there is something for a waiter to look at: connected, or closed.
        self._ready = asyncio.Event()
        self._first_up = asyncio.Event()
        self._closed = asyncio.Event()
        self._reconnect_ceiling: float | None = None
        self._fail_fast = False
        self._start_waiting = False

    # --- state ---

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def connected(self) -> bool:
        """Connected, with every subscription made (the on-connect hooks may still be running)."""
        return self._connected

    @property
    def error(self) -> SessionError | None:
        """The fatal error that ended the session, if any."""
        return self._error

    @property
    def dropped_messages(self) -> int:
        """Messages a coroutine handler lost because it fell ``handler_queue_limit`` behind."""
        return self._dropped

    @property
    def inflight_limit(self) -> int | None:
        """Unacknowledged requests allowed on the current connection, or None when down."""
        link = self._link
        return link.limit if self._connected and link is not None else None

    # --- lifecycle ---

    # The timeouts are parameters, as in aiomqtt, because each request has its own default
    # (request_timeout_s) and the session needs to know which wait timed out to say so.
    async def start(
        self, *, wait: bool = True, timeout: float | None = None, fail_fast: bool = False
    ) -> None:
        """Start connecting (retrying with backoff until ``stop()`` or a fatal refusal).

        With ``wait``, return once connected and the first run of the on-connect hooks is over;
        raise the fatal error (``ProtocolVersionRefused``, ``AuthenticationFailed``, ...) or
        ``SessionTimeout`` after ``timeout`` seconds. A failed start leaves the session stopped.

        ``fail_fast`` is for a person waiting on a command: until the first connection, a
        failure that retrying will not soon fix (connection refused, unknown host, TLS
        verification) ends the session at once with ``ConnectFailed``; timeouts and resets are
        still retried. Once connected, every failure is retried as usual.
        """
        if self._supervisor is not None or self._closed.is_set():
            raise RuntimeError("a session can be started only once")
        self._fail_fast = fail_fast
        self._supervisor = asyncio.get_running_loop().create_task(
            self._supervise(), name=f"mqtt-session-{self._client_id}"
        )
        if not wait:
            return
        up = asyncio.ensure_future(self._first_up.wait())
        closed = asyncio.ensure_future(self._closed.wait())
        self._start_waiting = True
        try:
            await asyncio.wait((up, closed), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await self.stop()
            raise
        finally:
            self._start_waiting = False
            up.cancel()
            closed.cancel()
        if self._first_up.is_set():
            return
        if self._error is not None:
            error: SessionError = self._error
        elif self._stopping:
            error = NotConnected("the session was stopped before it connected")
        elif self._connected:
            error = SessionTimeout(
                f"connected to {self._where}, but the on-connect hooks did not finish "
                f"within {timeout} s"
            )
        else:
            failure = self._last_error
            last = f" (last error: {describe_connect_failure(failure)})" if failure else ""
            error = SessionTimeout(f"could not connect to {self._where} within {timeout} s{last}")
        await self.stop()
        raise error

    async def stop(self) -> None:
        """Send DISCONNECT, stop reconnecting and stop the handler tasks. Idempotent."""
        self._stopping = True
        link = self._link
        if link is not None and link.client is not None and not link.lost.is_set():
            try:
                async with asyncio.timeout(self._settings.connect_timeout_s):
                    await link.client.disconnect()
            except (TimeoutError, OSError):
                link.client.abort()
            # gmqtt reports the closed transport from its protocol callback; make sure.
            self._link_lost(link, None)
        tasks: list[asyncio.Task[Any]] = []
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None and supervisor is not asyncio.current_task():
            supervisor.cancel()
            tasks.append(supervisor)
        for subscription in self._subscriptions.values():
            for handler in subscription.handlers:
                task = handler.close()
                if task is not None:
                    tasks.append(task)
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
                tasks.append(task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._close()

    async def __aenter__(self) -> Session:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until connected; raise the fatal error, NotConnected once stopped, or
        SessionTimeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._ready_link()
        except TimeoutError:
            raise SessionTimeout(f"not connected to {self._where} within {timeout} s") from None

    async def wait_closed(self) -> None:
        """Wait until the session ends; raise the fatal error if that is why it ended."""
        await self._closed.wait()
        if self._error is not None:
            raise self._error

    # --- hooks ---

    def on_connect(self, hook: ConnectHook) -> ConnectHook:
        """Run ``hook`` after every CONNACK, once all subscriptions are SUBACKed.

        Hooks run one after another in registration order; an exception is logged and the next
        hook runs. A hook may publish and subscribe (the session is connected by then).
        """
        self._connect_hooks.append(hook)
        return hook

    def on_disconnect(self, hook: DisconnectHook) -> DisconnectHook:
        """Call ``hook`` (synchronously) whenever a connected session loses its connection,
        including on ``stop()``."""
        self._disconnect_hooks.append(hook)
        return hook

    def remove_hook(self, hook: ConnectHook | DisconnectHook) -> None:
        """Unregister an on-connect or on-disconnect hook (nothing if it is not registered)."""
        self._connect_hooks = [h for h in self._connect_hooks if h != hook]
        self._disconnect_hooks = [h for h in self._disconnect_hooks if h != hook]

    def drop_link(self, why: str) -> None:
        """Resets the current connection at once and reconnects: what was sent on it and not
        yet delivered never is (see GmqttClient.abort)."""
        link = self._link
        if link is None or link.lost.is_set():
            return
        link.ended_with(SessionError(why))
        self._link_lost(link, None)

    def set_reconnect_ceiling(self, ceiling_s: float | None) -> None:
        """Reconnect within ``ceiling_s`` (full jitter below it) until set back to None.

        For a caller that holds something the broker will take away if it stays away too
        long (a lease): the ordinary backoff grows to ``reconnect_max_s`` and resets only
        after a long stable link, which can push a reconnect past the lease.
        """
        if ceiling_s is not None and not ceiling_s > 0:
            raise ValueError("the reconnect ceiling must be positive")
        self._reconnect_ceiling = ceiling_s

    # --- requests ---

    async def subscribe(
        self,
        topic_filter: str,
        handler: Handler,
        *,
        qos: int = 1,
        timeout: float | None = None,
    ) -> None:
        """Deliver messages matching ``topic_filter`` to ``handler``, on this and every later
        connection.

        When connected, returns after the SUBACK and raises ``SubscribeFailed`` on a failure
        reason code (the handler is then not registered). When not connected (or when the link
        drops before the SUBACK), the subscription is remembered and made, before the session
        counts as connected, on the next connect. Subscribing again to a filter already
        subscribed at the same or a higher QoS only adds the handler (it does not get the
        retained messages again).
        """
        validate_topic_filter(topic_filter)
        if qos not in (0, 1, 2):
            raise ValueError("qos must be 0, 1 or 2")
        entry = HandlerEntry(
            handler,
            client_id=self._client_id,
            log=self._log,
            spawn=self._spawn,
            queue_limit=self._handler_queue_limit,
            on_drop=self._count_drop,
        )
        subscription = self._subscriptions.get(topic_filter)
        previous_qos = subscription.qos if subscription is not None else None
        send = subscription is None or qos > subscription.qos
        if subscription is None:
            subscription = self._subscriptions.add(topic_filter, qos)
        subscription.qos = max(subscription.qos, qos)
        subscription.handlers.append(entry)
        link = self._link if self._connected else None
        if not send or link is None or link.client is None:
            return
        limit = self._timeout(timeout)
        try:
            async with asyncio.timeout(limit):
                ack = await link.send(functools.partial(send_subscribe, link, subscription))
                (code,) = await ack
        except NotConnected:
            return  # remembered: made on the next connect
        except BaseException as exc:
            self._subscriptions.forget(subscription, entry, previous_qos)
            if isinstance(exc, TimeoutError):
                raise SessionTimeout(f"no SUBACK for {topic_filter!r} within {limit} s") from None
            raise
        if code >= 0x80:
            self._subscriptions.forget(subscription, entry, previous_qos)
            raise SubscribeFailed(topic_filter, code)

    async def unsubscribe(
        self,
        topic_filter: str,
        handler: Handler | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """Remove ``handler`` (or every handler) from ``topic_filter``; once none is left,
        unsubscribe at the broker (when connected) and do not subscribe again."""
        subscription = self._subscriptions.get(topic_filter)
        if subscription is None:
            return
        for entry in list(subscription.handlers):
            if handler is None or entry.callback == handler:
                self._subscriptions.forget(subscription, entry)
        if subscription.handlers:
            return
        link = self._link if self._connected else None
        if link is None or link.client is None:
            return
        client = link.client
        limit = self._timeout(timeout)
        try:
            async with asyncio.timeout(limit):
                ack = await link.send(functools.partial(client.unsubscribe_mid, topic_filter))
                codes = await ack
        except NotConnected:
            return  # the next connection will not subscribe to it
        except TimeoutError:
            raise SessionTimeout(f"no UNSUBACK for {topic_filter!r} within {limit} s") from None
        if codes and codes[0] >= 0x80:
            raise SubscribeFailed(topic_filter, codes[0], unsubscribe=True)

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
        content_type: str | None = None,
        message_expiry_interval: int | None = None,
        user_properties: Iterable[tuple[str, str]] = (),
        timeout: float | None = None,
        wait_connected: bool = False,
    ) -> None:
        """Publish a message; with QoS 1, return once the broker's PUBACK arrives.

        Raises ``NotConnected`` at once while disconnected, unless ``wait_connected``: then the
        message is sent once the session is connected again, within ``timeout``.
        ``NotConnected`` is also raised when the link drops before the PUBACK (the message may
        or may not have reached the broker). ``PublishFailed`` on a PUBACK reason code >= 0x80,
        ``SessionTimeout`` when ``timeout`` (default ``request_timeout_s``) passes.
        """
        validate_topic_name(topic)
        if qos not in (0, 1):
            raise ValueError("qos must be 0 or 1")
        if response_topic is not None:
            validate_topic_name(response_topic)
        if message_expiry_interval is not None and not 0 <= message_expiry_interval <= 0xFFFFFFFF:
            raise ValueError("message_expiry_interval must fit in 32 bits")
        # gmqtt would turn str, numbers and JSON-able objects into bytes; insist on bytes.
        if not isinstance(payload, _BYTES_LIKE):
            raise TypeError("payload must be bytes")
        message = outgoing(
            topic,
            bytes(payload),
            qos=qos,
            retain=retain,
            response_topic=response_topic,
            correlation_data=bytes(correlation_data) if correlation_data is not None else None,
            content_type=content_type,
            message_expiry_interval=message_expiry_interval,
            user_properties=[(str(name), str(value)) for name, value in user_properties],
        )

        limit = self._timeout(timeout)
        if qos == 1 and not wait_connected:
            # The common case, connected with room in the window: the PUBACK is the only thing
            # to wait for, and a timer on it is much cheaper than asyncio.timeout() around the
            # whole (measured with tests/bench/bench_client.py). Anything else takes the
            # general path below, which behaves the same.
            loop = asyncio.get_running_loop()
            deadline_at = loop.time() + limit
            link = self._current_link()
            client = link.client
            assert client is not None
            if not link.window.locked():
                # Cannot suspend: there is room in the window.
                ack = await link.send(functools.partial(client.publish_mid, message))
                try:
                    code = await wait_until(loop, ack, deadline_at)
                except TimeoutError:
                    raise SessionTimeout(
                        f"publish to {topic!r}: no PUBACK within {limit} s"
                    ) from None
                if code >= 0x80:
                    raise PublishFailed(topic, code)
                return

        waiting = f"no connection to {self._where}"
        try:
            async with asyncio.timeout(limit) as deadline:
                while True:
                    link = await self._ready_link() if wait_connected else self._current_link()
                    client = link.client
                    assert client is not None
                    if qos == 0:
                        client.publish_mid(message)
                        return
                    waiting = "no room in the in-flight window"
                    try:
                        ack = await link.send(functools.partial(client.publish_mid, message))
                    except NotConnected:
                        if wait_connected:
                            waiting = f"no connection to {self._where}"
                            continue  # nothing was sent: wait for the next connection
                        raise
                    waiting = "no PUBACK"
                    code = await ack
                    break
        except TimeoutError:
            if not deadline.expired():
                raise
            raise SessionTimeout(f"publish to {topic!r}: {waiting} within {limit} s") from None
        if code >= 0x80:
            raise PublishFailed(topic, code)

    # --- internals: requests ---

    def _timeout(self, timeout: float | None) -> float:
        return self._settings.request_timeout_s if timeout is None else timeout

    def _current_link(self) -> Link:
        if self._error is not None:
            raise self._error
        link = self._link
        if not self._connected or link is None:
            raise NotConnected(f"not connected to {self._where}")
        return link

    async def _ready_link(self) -> Link:
        while True:
            if self._error is not None:
                raise self._error
            if self._closed.is_set() or self._stopping:
                raise NotConnected("the session is stopped")
            link = self._link
            if self._connected and link is not None:
                return link
            await self._ready.wait()

    # --- internals: what the link reports (synchronously, as packets are read) ---

    def _on_message(self, link: Link, message: Message, identifiers: list[int]) -> None:
        if link is not self._link:
            return
        self._subscriptions.deliver(message, identifiers)

    def _on_undecodable(self, link: Link) -> None:
        if link is self._link:
            self._log.warning(
                "MQTT client %s: dropped a message whose topic is not UTF-8", self._client_id
            )

    def _link_lost(self, link: Link, reason: int | None) -> None:
        if not link.mark_lost(reason):
            return
        if link is not self._link or not self._connected:
            return
        self._connected = False
        self._ready.clear()
        if self._stopping:
            self._log.info("MQTT client %s disconnected from %s", self._client_id, self._where)
        else:
            error = link.transport_error
            self._log.warning(
                "MQTT client %s lost its connection to %s%s",
                self._client_id,
                self._where,
                disconnect_detail(link.disconnect_reason)
                or (f": {describe_connect_failure(error)}" if error is not None else ""),
            )
        for hook in list(self._disconnect_hooks):
            try:
                hook()
            except Exception:
                self._log.exception(
                    "MQTT client %s: on-disconnect hook %r failed", self._client_id, hook
                )

    # --- internals: connection supervision ---

    async def _supervise(self) -> None:
        settings = self._settings
        secret = exposed_secret(settings)
        if secret is not None:
            self._log.warning(
                "MQTT client %s sends %s to %s without TLS: anyone on the way can read it "
                "(set mqtt.tls)",
                self._client_id,
                secret,
                self._where,
            )
        try:
            while not self._stopping:
                link: Link | None = None
                try:
                    link = await self._open_link()
                    self._link = link
                    await self._bring_up(link)
                    await link.lost.wait()
                    if self._stopping:
                        return
                    # Start the backoff from the bottom only after a link that stayed up for a
                    # while, so a broker that accepts and then drops us at once (duplicate
                    # client id, ACL) is not hammered.
                    if time.monotonic() - link.up_since >= settings.reconnect_max_s:
                        self._backoff.reset()
                    failure: BaseException | None = None
                except ConnectionRefused as exc:
                    if exc.fatal:
                        self._fail(exc)
                        return
                    failure = exc
                except (OSError, TimeoutError, SessionError) as exc:
                    failure = exc
                if link is not None and not link.lost.is_set():
                    self._link_lost(link, None)
                if self._stopping:
                    return
                if (
                    failure is not None
                    and self._fail_fast
                    and not self._first_up.is_set()
                    and is_definitive(failure)
                ):
                    self._fail(ConnectFailed(describe_connect_failure(failure)))
                    return
                delay = self._backoff.next_delay(ceiling=self._reconnect_ceiling)
                if failure is not None:
                    self._last_error = failure
                    self._log.warning(
                        "MQTT client %s could not connect to %s: %s; retrying in %.2f s",
                        self._client_id,
                        self._where,
                        describe_connect_failure(failure),
                        delay,
                    )
                else:
                    self._log.debug("MQTT client %s reconnects in %.2f s", self._client_id, delay)
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: surface it instead of retrying it forever
            self._log.exception("MQTT client %s: session supervisor failed", self._client_id)
            self._fail(SessionError(f"MQTT session failed: {exc!r}"))
        finally:
            if self._stopping:
                self._close()

    async def _open_link(self) -> Link:
        """Connect once: TCP, TLS, CONNECT and CONNACK, all within connect_timeout_s."""
        settings = self._settings
        connect_timeout = settings.connect_timeout_s
        if self._reconnect_ceiling is not None:
            # A black-holed attempt must not use up the time the ceiling is there to save.
            connect_timeout = min(connect_timeout, max(1.0, 4 * self._reconnect_ceiling))
        # The token file is read anew for every attempt (rotation), in a thread (file I/O).
        if settings.sat_file is not None:
            credentials = await asyncio.to_thread(read_credentials, settings)
        else:
            credentials = read_credentials(settings)
        return await open_link(
            settings,
            self._client_id,
            credentials,
            self._ssl,
            connect_timeout=connect_timeout,
            will=self._will,
            on_message=self._on_message,
            on_undecodable=self._on_undecodable,
            on_lost=self._link_lost,
        )

    async def _bring_up(self, link: Link) -> None:
        """Make every subscription, count as connected, then run the on-connect hooks."""
        made: dict[int, int] = {}  # subscription identifier -> QoS subscribed with
        while True:
            # Loop: subscribe() calls made while this runs are not sent by them (the session is
            # not connected yet), so pick them up before declaring the session connected.
            todo = [
                (subscription, subscription.qos)
                for subscription in self._subscriptions.values()
                if made.get(subscription.identifier, -1) < subscription.qos
            ]
            if not todo:
                break
            try:
                async with asyncio.timeout(self._settings.request_timeout_s):
                    # One SUBSCRIBE per filter: a packet carries one subscription identifier.
                    acks = [
                        await link.send(functools.partial(send_subscribe, link, subscription))
                        for subscription, _ in todo
                    ]
                    results = await asyncio.gather(*acks)
            except TimeoutError:
                raise SessionTimeout(
                    f"no SUBACK within {self._settings.request_timeout_s} s while re-subscribing"
                ) from None
            for (subscription, qos), (code,) in zip(todo, results, strict=True):
                made[subscription.identifier] = qos
                if code >= 0x80:
                    self._log.error(
                        "MQTT client %s: %s",
                        self._client_id,
                        SubscribeFailed(subscription.topic_filter, code),
                    )
        if link.lost.is_set():
            raise NotConnected("lost the connection while re-subscribing")
        link.up_since = time.monotonic()
        self._connected = True
        self._last_error = None
        self._ready.set()
        self._log.info(
            "MQTT client %s connected to %s (MQTT 5%s, keep-alive %d s, in-flight window %d)",
            self._client_id,
            self._where,
            ", TLS" if self._ssl is not None else "",
            self._settings.keepalive_s,
            link.limit,
        )
        for hook in list(self._connect_hooks):
            if link.lost.is_set():
                return  # the remaining hooks run after the next connect
            try:
                await hook()
            except Exception:
                self._log.exception(
                    "MQTT client %s: on-connect hook %r failed", self._client_id, hook
                )
        if not link.lost.is_set():
            self._first_up.set()

    def _fail(self, error: SessionError) -> None:
        self._error = error
        # A start() waiting for the first connection raises the error to its caller, who
        # reports it; otherwise this line is all an operator gets.
        level = logging.DEBUG if self._start_waiting else logging.ERROR
        self._log.log(
            level, "MQTT client %s gives up on %s: %s", self._client_id, self._where, error
        )
        self._close()

    def _close(self) -> None:
        self._connected = False
        self._closed.set()
        self._ready.set()  # wake waiters so they see the end

    def _count_drop(self) -> None:
        self._dropped += 1

    def _spawn(self, awaitable: Awaitable[None]) -> None:
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
