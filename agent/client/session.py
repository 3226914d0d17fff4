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
flight on it), ``handlers``, ``subscriptions`` (what every connection subscribes to, and
which handlers a message goes to), ``supervisor`` (one link after another: reconnecting
with backoff, bringing each link up, the end of the session) and ``publishing`` (one
PUBLISH and the wait for its PUBACK).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import uuid
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Any, Final

from agent.backoff import Backoff
from agent.client.gmqtt_client import outgoing
from agent.client.handlers import DEFAULT_QUEUE_LIMIT, Handler, HandlerEntry
from agent.client.publishing import send_publish
from agent.client.session_errors import (
    AuthenticationFailed,
    ConnectFailed,
    ConnectionRefused,
    LostInFlight,
    NotConnected,
    ProtocolVersionRefused,
    PublishFailed,
    SessionError,
    SessionTimeout,
    SettingNames,
    SubscribeFailed,
    TlsPortWithoutTls,
    own_names,
)
from agent.client.subscriptions import Subscriptions, send_subscribe
from agent.client.supervisor import ConnectHook, DisconnectHook, Supervisor
from agent.client.tls import TlsSetupFailed, build_ssl_context
from agent.config import check_client_id, default_client_id
from agent.message import Message
from agent.protocol.mqtt_topics import validate_topic_filter, validate_topic_name

if TYPE_CHECKING:
    from agent.config import MqttSettings

__all__ = [
    "AuthenticationFailed",
    "ConnectFailed",
    "ConnectionRefused",
    "Handler",
    "LostInFlight",
    "Message",
    "NotConnected",
    "ProtocolVersionRefused",
    "PublishFailed",
    "Session",
    "SessionError",
    "SessionTimeout",
    "SettingNames",
    "SubscribeFailed",
    "TlsPortWithoutTls",
    "TlsSetupFailed",
]

_log = logging.getLogger(__name__)

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
        names: SettingNames = own_names,
    ) -> None:
        """``will``: the Last Will the broker publishes when a connection ends without a
        DISCONNECT (a crash, a lost network), sent in every CONNECT. ``names``: how the
        person who made ``settings`` calls each of them (the flag typed, the environment
        variable), for the errors and log lines that say which to check."""
        self._settings = settings
        if will is not None:
            validate_topic_name(will.topic)
        if client_id is None:
            # Unique per instance even when nothing better is known; the agent passes one
            # derived from its device and instance ids.
            client_id = settings.client_id or default_client_id("session", uuid.uuid4().hex[:12])
        self._client_id = check_client_id(client_id)
        self._log = logger or _log
        backoff = Backoff(settings.reconnect_min_s, settings.reconnect_max_s, rng=rng)
        # A coroutine handler that falls this far behind loses its oldest messages (handlers.py).
        if handler_queue_limit < 1:
            raise ValueError("handler_queue_limit must be at least 1")
        self._handler_queue_limit = handler_queue_limit
        self._dropped = 0
        ssl_context = build_ssl_context(settings.tls, names)

        self._subscriptions = Subscriptions()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._supervisor = Supervisor(
            settings,
            client_id=self._client_id,
            will=will,
            log=self._log,
            backoff=backoff,
            ssl_context=ssl_context,
            subscriptions=self._subscriptions,
            names=names,
        )

    # --- state ---

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def connected(self) -> bool:
        """Connected, with every subscription made (the on-connect hooks may still be running)."""
        return self._supervisor.connected

    @property
    def error(self) -> SessionError | None:
        """The fatal error that ended the session, if any."""
        return self._supervisor.error

    @property
    def connect_failure(self) -> str | None:
        """Why the last attempt to connect failed, while not connected (None: connected, or
        no attempt has failed yet)."""
        return self._supervisor.connect_failure

    @property
    def dropped_messages(self) -> int:
        """Messages a coroutine handler lost because it fell ``handler_queue_limit`` behind."""
        return self._dropped

    @property
    def inflight_limit(self) -> int | None:
        """Unacknowledged requests allowed on the current connection, or None when down."""
        link = self._supervisor.link
        return link.limit if self._supervisor.connected and link is not None else None

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
        self._supervisor.start(fail_fast=fail_fast)
        if not wait:
            return
        try:
            error = await self._supervisor.wait_started(timeout)
        except BaseException:
            await self.stop()
            raise
        if error is None:
            return
        await self.stop()
        raise error

    async def stop(self) -> None:
        """Send DISCONNECT, stop reconnecting and stop the handler tasks. Idempotent."""
        tasks: list[asyncio.Task[Any]] = []
        supervisor = await self._supervisor.stop()
        if supervisor is not None:
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
        self._supervisor.close()

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
                await self._supervisor.ready_link()
        except TimeoutError:
            raise SessionTimeout(
                f"not connected to {self._supervisor.where} within {timeout} s"
            ) from None

    async def wait_closed(self) -> None:
        """Wait until the session ends; raise the fatal error if that is why it ended."""
        await self._supervisor.wait_closed()

    # --- hooks ---

    def on_connect(self, hook: ConnectHook) -> ConnectHook:
        """Run ``hook`` after every CONNACK, once all subscriptions are SUBACKed.

        Hooks run one after another in registration order; an exception is logged and the next
        hook runs. A hook may publish and subscribe (the session is connected by then).
        """
        self._supervisor.connect_hooks.append(hook)
        return hook

    def on_disconnect(self, hook: DisconnectHook) -> DisconnectHook:
        """Call ``hook`` (synchronously) whenever a connected session loses its connection,
        including on ``stop()``."""
        self._supervisor.disconnect_hooks.append(hook)
        return hook

    def remove_hook(self, hook: ConnectHook | DisconnectHook) -> None:
        """Unregister an on-connect or on-disconnect hook (nothing if it is not registered)."""
        supervisor = self._supervisor
        supervisor.connect_hooks = [h for h in supervisor.connect_hooks if h != hook]
        supervisor.disconnect_hooks = [h for h in supervisor.disconnect_hooks if h != hook]

    def drop_link(self, why: str) -> None:
        """Resets the current connection at once and reconnects: what was sent on it and not
        yet delivered never is (see GmqttClient.abort)."""
        self._supervisor.drop_link(why)

    def set_reconnect_ceiling(self, ceiling_s: float | None) -> None:
        """Reconnect within ``ceiling_s`` (full jitter below it) until set back to None.

        For a caller that holds something the broker will take away if it stays away too
        long (a lease): the ordinary backoff grows to ``reconnect_max_s`` and resets only
        after a long stable link, which can push a reconnect past the lease.
        """
        if ceiling_s is not None and not ceiling_s > 0:
            raise ValueError("the reconnect ceiling must be positive")
        self._supervisor.reconnect_ceiling = ceiling_s

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
        supervisor = self._supervisor
        link = supervisor.link if supervisor.connected else None
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
        supervisor = self._supervisor
        link = supervisor.link if supervisor.connected else None
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
        ``LostInFlight`` (a ``NotConnected``) when the link drops before the PUBACK (the message
        may or may not have reached the broker). ``PublishFailed`` on a PUBACK reason code >= 0x80,
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
        await send_publish(
            self._supervisor,
            message,
            topic=topic,
            qos=qos,
            limit=limit,
            wait_connected=wait_connected,
        )

    # --- internals ---

    def _timeout(self, timeout: float | None) -> float:
        return self._settings.request_timeout_s if timeout is None else timeout

    def _count_drop(self) -> None:
        self._dropped += 1

    def _spawn(self, awaitable: Awaitable[None]) -> None:
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
