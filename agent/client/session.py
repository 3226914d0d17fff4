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

Each connection uses a fresh gmqtt ``Client``: no state of a dead connection (packet ids,
subscription bookkeeping, a protocol downgrade) can leak into the next one. The session always
connects with Clean Start and no session expiry, so the broker keeps nothing between connections
and in-flight QoS 1 publishes fail with ``NotConnected`` when the link drops (the caller decides
whether to resend).

gmqtt cannot send MQTT 5 authentication data (AUTH packets / the Authentication Data property),
so Kubernetes service-account-token (K8S-SAT) authentication is not possible through it; use
X.509 client certificates or user name and password.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import random
import ssl
import struct
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import gmqtt  # type: ignore[import-untyped]
from gmqtt.mqtt.constants import (  # type: ignore[import-untyped]
    ConnAckReasonCode,
    MQTTv50,
    PubAckReasonCode,
    SubAckReasonCode,
)
from gmqtt.mqtt.handler import MQTTConnectError  # type: ignore[import-untyped]

from agent.config import MqttSettings, TlsSettings, check_client_id, default_client_id
from agent.message import Message

__all__ = [
    "AuthenticationFailed",
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
    "backoff_delay",
    "build_ssl_context",
    "topic_matches",
    "validate_topic",
    "validate_topic_filter",
]

_log = logging.getLogger(__name__)

# CONNACK reason codes (MQTT 5 §3.2.2.2) that retrying cannot fix; anything else not listed
# (server unavailable or busy, quota or rate exceeded, unspecified) is treated as transient.
_UNSUPPORTED_PROTOCOL_VERSION: Final = 0x84
_V311_UNACCEPTABLE_PROTOCOL: Final = 0x01
_AUTH_FAILURES: Final = frozenset({0x86, 0x87, 0x8C})  # bad credentials, not authorized, method
_FATAL_CONNACK: Final = frozenset(
    {0x81, 0x82, 0x84, 0x85, 0x86, 0x87, 0x8A, 0x8C, 0x90, 0x95, 0x99, 0x9A, 0x9B, 0x9C, 0x9D}
)
_SESSION_TAKEN_OVER: Final = 0x8E


# --- Errors ---------------------------------------------------------------------------------


class SessionError(Exception):
    """Base class of every error the session raises."""


class NotConnected(SessionError, ConnectionError):
    """The session has no connection to the broker (or lost it before the acknowledgement)."""


class SessionTimeout(SessionError, TimeoutError):
    """A connect, publish, subscribe or unsubscribe did not complete within its timeout."""


class ConnectionRefused(SessionError):
    """The broker answered CONNECT with a failure reason code."""

    def __init__(self, reason_code: int, message: str, *, fatal: bool) -> None:
        super().__init__(message)
        self.reason_code = reason_code
        self.fatal = fatal


class ProtocolVersionRefused(ConnectionRefused):
    """The broker does not accept MQTT 5. Fatal: the agent never falls back to MQTT 3.1.1."""


class AuthenticationFailed(ConnectionRefused):
    """The broker refused the credentials or the client certificate. Fatal."""


class PublishFailed(SessionError):
    """The broker answered a QoS 1 PUBLISH with a failure reason code (>= 0x80)."""

    def __init__(self, topic: str, reason_code: int) -> None:
        super().__init__(
            f"the broker refused the publish to {topic!r}: "
            f"{_reason_name(PubAckReasonCode, reason_code)}"
        )
        self.topic = topic
        self.reason_code = reason_code


class SubscribeFailed(SessionError):
    """The broker answered a SUBSCRIBE or UNSUBSCRIBE with a failure reason code (>= 0x80)."""

    def __init__(self, topic_filter: str, reason_code: int, *, unsubscribe: bool = False) -> None:
        verb = "unsubscribe from" if unsubscribe else "subscription to"
        super().__init__(
            f"the broker refused the {verb} {topic_filter!r}: "
            f"{_reason_name(SubAckReasonCode, reason_code)}"
        )
        self.topic_filter = topic_filter
        self.reason_code = reason_code


def _reason_name(codes: Any, code: int) -> str:
    try:
        name = str(codes(code).name).replace("_", " ").lower()
    except ValueError:
        name = "unknown reason"
    return f"0x{code:02X} ({name})"


def _connack_error(code: int) -> ConnectionRefused:
    name = _reason_name(ConnAckReasonCode, code)
    if code in (_UNSUPPORTED_PROTOCOL_VERSION, _V311_UNACCEPTABLE_PROTOCOL):
        return ProtocolVersionRefused(
            code,
            f"the broker refused MQTT 5 (CONNACK {name}); the agent needs MQTT 5 and does not "
            "fall back to MQTT 3.1.1, which loses every message property",
            fatal=True,
        )
    if code in _AUTH_FAILURES:
        return AuthenticationFailed(
            code,
            f"the broker refused the credentials (CONNACK {name}); check mqtt.username, "
            "mqtt.password and the client certificate (mqtt.tls.cert_file)",
            fatal=True,
        )
    fatal = code in _FATAL_CONNACK or code < 0x80
    return ConnectionRefused(
        code, f"the broker refused the connection (CONNACK {name})", fatal=fatal
    )


# --- Pure helpers ---------------------------------------------------------------------------


def backoff_delay(
    attempt: int,
    minimum: float,
    maximum: float,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """Delay before reconnect attempt ``attempt`` (0-based): exponential backoff, full jitter.

    ``uniform(0, min(maximum, minimum * 2**attempt))``: spreading the whole interval (rather than
    adding a little jitter to a fixed delay) is what keeps a fleet that lost its broker at the
    same instant from reconnecting in lock-step.
    """
    if attempt < 0:
        raise ValueError("attempt must be >= 0")
    ceiling = min(maximum, minimum * 2.0 ** min(attempt, 64))
    return uniform(0.0, ceiling)


def validate_topic(topic: str) -> str:
    """Raise ValueError unless topic is a valid topic name to publish to."""
    if not topic:
        raise ValueError("topic must not be empty")
    if "+" in topic or "#" in topic:
        raise ValueError(f"topic {topic!r} must not contain wildcards")
    if "\x00" in topic or len(topic.encode()) > 0xFFFF:
        raise ValueError(f"topic {topic!r} is not a valid MQTT topic")
    return topic


def validate_topic_filter(topic_filter: str) -> str:
    """Raise ValueError unless topic_filter is a valid filter (``+``/``#``, ``$share/<g>/``)."""
    if not topic_filter or "\x00" in topic_filter or len(topic_filter.encode()) > 0xFFFF:
        raise ValueError(f"topic filter {topic_filter!r} is not valid")
    body = topic_filter
    if topic_filter.startswith("$share/"):
        parts = topic_filter.split("/", 2)
        if len(parts) < 3 or not parts[1] or "+" in parts[1] or "#" in parts[1] or not parts[2]:
            raise ValueError(f"shared subscription {topic_filter!r} is not $share/<group>/<filter>")
        body = parts[2]
    levels = body.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            raise ValueError(f"'#' must be the whole last level in {topic_filter!r}")
        if "+" in level and level != "+":
            raise ValueError(f"'+' must be a whole level in {topic_filter!r}")
    return topic_filter


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether a message published to ``topic`` matches ``topic_filter`` (MQTT 5 §4.7)."""
    if topic_filter == topic and not topic_filter.startswith("$share/"):
        return True  # what the level by level comparison below would find, at a fraction
    if topic_filter.startswith("$share/"):
        # The broker picks one member of the group; for the member, the filter is what follows.
        topic_filter = topic_filter.split("/", 2)[2] if topic_filter.count("/") >= 2 else ""
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    # Wildcards at the first level never match topics starting with "$" ($SYS, ...).
    if topic.startswith("$") and filter_levels[0] in ("+", "#"):
        return False
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True  # also matches the parent level: "a/#" matches "a"
        if index >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[index]:
            return False
    return len(filter_levels) == len(topic_levels)


# Every message without subscription identifiers is matched against every subscription; the
# same few (filter, topic) pairs come back all the time (the response topic above all).
_cached_topic_matches = functools.lru_cache(maxsize=1024)(topic_matches)


def build_ssl_context(tls: TlsSettings) -> ssl.SSLContext | None:
    """The TLS context for ``tls``, or None when TLS is off. Verifies the broker's host name."""
    if not tls.enabled:
        return None
    try:
        context = ssl.create_default_context(
            cafile=str(tls.ca_file) if tls.ca_file is not None else None
        )
        if tls.cert_file is not None:
            password: Callable[[], str] | str
            if tls.key_password is not None:
                password = tls.key_password.get_secret_value()
            else:
                # Without a callback OpenSSL would prompt on the terminal for an encrypted key.
                password = _no_key_password
            context.load_cert_chain(tls.cert_file, tls.key_file, password=password)
    except (OSError, ssl.SSLError, _KeyPasswordMissing) as exc:
        raise SessionError(f"cannot set up TLS from mqtt.tls: {exc}") from None
    return context


class _KeyPasswordMissing(Exception):
    pass


def _no_key_password() -> str:
    raise _KeyPasswordMissing("mqtt.tls.key_file is encrypted; set mqtt.tls.key_password")


# --- Messages and handlers ------------------------------------------------------------------


Handler: TypeAlias = Callable[[Message], Awaitable[None] | None]
ConnectHook: TypeAlias = Callable[[], Awaitable[None]]
DisconnectHook: TypeAlias = Callable[[], None]


class _HandlerEntry:
    """One registered handler.

    Plain functions run synchronously as the message is read, before anything else can happen,
    so a response handler can never be held up by another handler. Coroutine functions get
    their own queue and task: messages reach each of them in order, one at a time, and a handler
    that awaits a request whose response arrives through the session does not block anything
    else (only a handler awaiting a message that would be delivered to itself could wait on
    itself).
    """

    def __init__(self, callback: Handler, session: Session) -> None:
        self.callback = callback
        self._session = session
        self._queue: asyncio.Queue[Message] | None = (
            asyncio.Queue() if inspect.iscoroutinefunction(callback) else None
        )
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def deliver(self, message: Message) -> None:
        if self._closed:
            return  # unsubscribed while this message was being dispatched
        if self._queue is not None:
            self._queue.put_nowait(message)
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._serve())
            return
        try:
            result = self.callback(message)
        except Exception:
            self._session._log_handler_error(self.callback, message)
            return
        if result is not None and inspect.isawaitable(result):
            # A plain function that returned an awaitable: run it, but do not wait for it.
            self._session._spawn(self._await(result, message))

    async def _await(self, awaitable: Awaitable[None], message: Message) -> None:
        try:
            await awaitable
        except Exception:
            self._session._log_handler_error(self.callback, message)

    async def _serve(self) -> None:
        assert self._queue is not None
        while not self._closed:  # a handler may unsubscribe itself from inside this task
            message = await self._queue.get()
            try:
                await self.callback(message)  # type: ignore[misc]
            except Exception:
                self._session._log_handler_error(self.callback, message)

    def close(self) -> asyncio.Task[None] | None:
        """Stop delivering; return the task to await if it was cancelled."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            return task
        return None


@dataclass(eq=False)
class _Subscription:
    topic_filter: str
    qos: int
    # MQTT 5 Subscription Identifier: the broker tags each message with the identifiers of the
    # subscriptions it was sent for. mosquitto sends one copy per matching subscription when
    # filters overlap, so matching topics alone would hand every copy to every handler.
    identifier: int
    handlers: list[_HandlerEntry] = field(default_factory=list)


# --- gmqtt adaptation -----------------------------------------------------------------------


class _GmqttClient(gmqtt.Client):  # type: ignore[misc]
    """gmqtt's Client without its own reconnect, plus the hooks gmqtt lacks.

    All reaching into gmqtt's internals is here (gmqtt is pinned to 0.8.x).
    """

    def __init__(
        self,
        client_id: str,
        *,
        on_downgrade: Callable[[], None],
        on_puback: Callable[[int, int], None],
    ) -> None:
        super().__init__(client_id)
        self._on_downgrade = on_downgrade
        handler = self._package_handler
        original = handler._handle_puback_packet

        def handle_puback(cmd: int, packet: bytes) -> None:
            original(cmd, packet)  # frees the packet id
            (mid,) = struct.unpack("!H", packet[:2])
            # MQTT 5 §3.4.2.1: no reason code byte means 0x00 (success).
            on_puback(mid, packet[2] if len(packet) > 2 else 0)

        # gmqtt ignores the PUBACK reason code and has no PUBACK callback. Its handler looks its
        # per-packet methods up by name, so an instance attribute takes precedence.
        handler._handle_puback_packet = handle_puback

    async def reconnect(self, delay: bool = False) -> None:
        # gmqtt calls this after a lost connection and after a refused CONNACK; the session
        # reconnects instead. On CONNACK "unacceptable protocol version" to an MQTT 5 CONNECT,
        # gmqtt has just switched itself to 3.1.1 and calls this to reconnect with it: refuse.
        if self.downgraded:
            self._on_downgrade()

    @property
    def downgraded(self) -> bool:
        """Whether gmqtt switched itself to MQTT 3.1.1 after a CONNACK refusing MQTT 5."""
        return bool(self._connection_state.protocol_version != MQTTv50)

    def publish_mid(self, message: gmqtt.Message) -> int | None:
        """Send a PUBLISH; gmqtt's publish() does not return the packet id we need."""
        mid, _ = self._connection.publish(message)
        return mid  # type: ignore[no-any-return]

    def abort(self) -> None:
        """Drop the TCP connection at once (no DISCONNECT, no TLS close_notify)."""
        connection = self._connection
        if connection is not None and not connection.is_closing():
            connection._transport.abort()


class _Link:
    """One network connection and what is in flight on it."""

    def __init__(self) -> None:
        self.client: _GmqttClient | None = None
        self.lost = asyncio.Event()
        self.refused_v5 = False
        self.disconnect_reason: int | None = None
        self.receive_maximum = 65535
        self.subscription_identifiers = True  # the CONNACK says otherwise if unsupported
        # Every request holding a gmqtt packet id (QoS 1 PUBLISH, SUBSCRIBE, UNSUBSCRIBE) holds a
        # permit until its acknowledgement or the loss of the link. Replaced at CONNACK.
        self.window = asyncio.Semaphore(1)
        self.limit = 1
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.up_since = 0.0


# --- The session ----------------------------------------------------------------------------


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
    ) -> None:
        self._settings = settings
        if client_id is None:
            # Unique per instance even when nothing better is known; the agent passes one
            # derived from its device and instance ids.
            client_id = settings.client_id or default_client_id("session", uuid.uuid4().hex[:12])
        self._client_id = check_client_id(client_id)
        self._log = logger or _log
        self._random = rng or random.Random()
        self._ssl = build_ssl_context(settings.tls)
        self._where = f"{settings.host}:{settings.port}"

        self._subscriptions: dict[str, _Subscription] = {}
        self._identifiers = itertools.count(1)
        self._connect_hooks: list[ConnectHook] = []
        self._disconnect_hooks: list[DisconnectHook] = []
        self._tasks: set[asyncio.Task[Any]] = set()

        self._supervisor: asyncio.Task[None] | None = None
        self._link: _Link | None = None
        self._connected = False
        self._stopping = False
        self._error: SessionError | None = None
        self._last_error: BaseException | None = None
        # Set whenever there is something for a waiter to look at: connected, or closed.
        self._ready = asyncio.Event()
        self._first_up = asyncio.Event()
        self._closed = asyncio.Event()
        self._reconnect_ceiling: float | None = None

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
    def inflight_limit(self) -> int | None:
        """Unacknowledged requests allowed on the current connection, or None when down."""
        link = self._link
        return link.limit if self._connected and link is not None else None

    # --- lifecycle ---

    # The timeouts are parameters, as in aiomqtt, because each request has its own default
    # (request_timeout_s) and the session needs to know which wait timed out to say so.
    async def start(self, *, wait: bool = True, timeout: float | None = None) -> None:
        """Start connecting (retrying with backoff until ``stop()`` or a fatal refusal).

        With ``wait``, return once connected and the first run of the on-connect hooks is over;
        raise the fatal error (``ProtocolVersionRefused``, ``AuthenticationFailed``, ...) or
        ``SessionTimeout`` after ``timeout`` seconds. A failed start leaves the session stopped.
        """
        if self._supervisor is not None or self._closed.is_set():
            raise RuntimeError("a session can be started only once")
        self._supervisor = asyncio.get_running_loop().create_task(
            self._supervise(), name=f"mqtt-session-{self._client_id}"
        )
        if not wait:
            return
        up = asyncio.ensure_future(self._first_up.wait())
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait((up, closed), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await self.stop()
            raise
        finally:
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
            last = f" (last error: {_describe(self._last_error)})" if self._last_error else ""
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
        for hooks in (self._connect_hooks, self._disconnect_hooks):
            while hook in hooks:
                hooks.remove(hook)

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
        entry = _HandlerEntry(handler, self)
        subscription = self._subscriptions.get(topic_filter)
        previous_qos = subscription.qos if subscription is not None else None
        send = subscription is None or qos > subscription.qos
        if subscription is None:
            subscription = self._subscriptions[topic_filter] = _Subscription(
                topic_filter, qos, next(self._identifiers)
            )
        subscription.qos = max(subscription.qos, qos)
        subscription.handlers.append(entry)
        link = self._link if self._connected else None
        if not send or link is None or link.client is None:
            return
        limit = self._timeout(timeout)
        try:
            async with asyncio.timeout(limit):
                ack = await self._send(link, functools.partial(_subscribe, link, subscription))
                (code,) = await ack
        except NotConnected:
            return  # remembered: made on the next connect
        except BaseException as exc:
            self._forget(subscription, entry, previous_qos)
            if isinstance(exc, TimeoutError):
                raise SessionTimeout(f"no SUBACK for {topic_filter!r} within {limit} s") from None
            raise
        if code >= 0x80:
            self._forget(subscription, entry, previous_qos)
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
                self._forget(subscription, entry)
        if subscription.handlers:
            return
        link = self._link if self._connected else None
        if link is None or link.client is None:
            return
        client = link.client
        limit = self._timeout(timeout)
        try:
            async with asyncio.timeout(limit):
                ack = await self._send(link, functools.partial(client.unsubscribe, topic_filter))
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
        validate_topic(topic)
        if qos not in (0, 1):
            raise ValueError("qos must be 0 or 1")
        if response_topic is not None:
            validate_topic(response_topic)
        properties: dict[str, Any] = {}
        if response_topic is not None:
            properties["response_topic"] = response_topic
        if correlation_data is not None:
            properties["correlation_data"] = bytes(correlation_data)
        if content_type is not None:
            properties["content_type"] = content_type
        if message_expiry_interval is not None:
            if not 0 <= message_expiry_interval <= 0xFFFFFFFF:
                raise ValueError("message_expiry_interval must fit in 32 bits")
            properties["message_expiry_interval"] = message_expiry_interval
        pairs = [(str(name), str(value)) for name, value in user_properties]
        if pairs:
            properties["user_property"] = pairs
        # gmqtt would turn str, numbers and JSON-able objects into bytes; insist on bytes.
        if not isinstance(payload, _BYTES_LIKE):
            raise TypeError("payload must be bytes")
        message = gmqtt.Message(topic, bytes(payload), qos=qos, retain=retain, **properties)

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
                ack = await self._send(link, functools.partial(client.publish_mid, message))
                try:
                    code = await _await_until(loop, ack, deadline_at)
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
                        ack = await self._send(link, functools.partial(client.publish_mid, message))
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

    def _current_link(self) -> _Link:
        if self._error is not None:
            raise self._error
        link = self._link
        if not self._connected or link is None:
            raise NotConnected(f"not connected to {self._where}")
        return link

    async def _ready_link(self) -> _Link:
        while True:
            if self._error is not None:
                raise self._error
            if self._closed.is_set() or self._stopping:
                raise NotConnected("the session is stopped")
            link = self._link
            if self._connected and link is not None:
                return link
            await self._ready.wait()

    async def _send(self, link: _Link, send: Callable[[], int | None]) -> asyncio.Future[Any]:
        """Send a request that takes a packet id, within the in-flight window of ``link``.

        Returns the future of its acknowledgement. Raises NotConnected, having sent nothing,
        when the link is (or goes) down before there is room in the window.
        """
        await link.window.acquire()
        if link.lost.is_set() or link.client is None:
            link.window.release()
            raise NotConnected(f"not connected to {self._where}")
        try:
            mid = send()
        except BaseException:
            link.window.release()
            raise
        assert mid is not None
        ack: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        # Stays registered (holding its permit) until the acknowledgement or the loss of the
        # link, even when the caller stops waiting: the packet id is in use at the broker.
        link.pending[mid] = ack
        return ack

    def _acknowledged(self, link: _Link, mid: int, result: Any) -> None:
        ack = link.pending.pop(mid, None)
        if ack is None:
            return
        link.window.release()
        if not ack.done():
            ack.set_result(result)

    def _forget(
        self, subscription: _Subscription, entry: _HandlerEntry, qos: int | None = None
    ) -> None:
        """Drop ``entry``, restoring the subscription's QoS to ``qos`` if given; drop the
        subscription with its last handler."""
        if qos is not None:
            subscription.qos = qos
        if entry in subscription.handlers:
            subscription.handlers.remove(entry)
        entry.close()
        if not subscription.handlers and (
            self._subscriptions.get(subscription.topic_filter) is subscription
        ):
            del self._subscriptions[subscription.topic_filter]

    # --- internals: gmqtt callbacks (run synchronously as packets are read) ---

    def _on_connack(self, link: _Link, _client: Any, _flags: int, _rc: int, props: Any) -> None:
        # Only called for a successful CONNACK; values of CONNACK properties come as lists.
        values = props.get("receive_maximum") if isinstance(props, dict) else None
        receive_maximum = values[0] if isinstance(values, list) and values else 65535
        link.receive_maximum = receive_maximum
        available = props.get("sub_id_available") if isinstance(props, dict) else None
        link.subscription_identifiers = not (isinstance(available, list) and available == [0])
        # gmqtt's packet id pool holds one id fewer than the Receive Maximum, and subscribe and
        # unsubscribe draw on the same pool; the window covers them all.
        id_pool = receive_maximum - 1 if receive_maximum >= 2 else 65534
        link.limit = max(1, min(self._settings.max_inflight, receive_maximum, id_pool))
        link.window = asyncio.Semaphore(link.limit)

    def _on_message(
        self, link: _Link, _client: Any, topic: Any, payload: bytes, qos: int, props: Any
    ) -> None:
        if link is not self._link:
            return
        if not isinstance(topic, str):
            self._log.warning(
                "MQTT client %s: dropped a message whose topic is not UTF-8", self._client_id
            )
            return

        correlation = _first(props, "correlation_data")
        message = Message(
            topic=topic,
            payload=bytes(payload),
            qos=qos,
            retain=bool(props.get("retain")),
            response_topic=_first(props, "response_topic"),
            correlation_data=bytes(correlation) if correlation is not None else None,
            content_type=_first(props, "content_type"),
            message_expiry_interval=_first(props, "message_expiry_interval"),
            user_properties=[(str(k), str(v)) for k, v in props.get("user_property", [])],
        )
        identifiers = props.get("subscription_identifier")
        for subscription in list(self._subscriptions.values()):
            if (
                subscription.identifier in identifiers
                if identifiers
                else _cached_topic_matches(subscription.topic_filter, topic)
            ):
                for entry in list(subscription.handlers):
                    entry.deliver(message)

    def _on_puback(self, link: _Link, mid: int, reason_code: int) -> None:
        self._acknowledged(link, mid, reason_code)

    def _on_suback(self, link: _Link, _client: Any, mid: int, codes: Any, *_: Any) -> None:
        self._acknowledged(link, mid, list(codes))

    def _on_gmqtt_disconnect(self, link: _Link, _client: Any, packet: Any = None, *_: Any) -> None:
        # A DISCONNECT from the broker carries a reason code; the one gmqtt synthesises when
        # the socket closes is empty.
        reason = packet[0] if isinstance(packet, bytes | bytearray) and packet else None
        self._link_lost(link, reason)

    def _on_downgrade(self, link: _Link) -> None:
        link.refused_v5 = True
        self._link_lost(link, None)

    def _link_lost(self, link: _Link, reason: int | None) -> None:
        if reason is not None and link.disconnect_reason is None:
            link.disconnect_reason = reason
        if link.lost.is_set():
            return
        link.lost.set()
        if link.client is not None:
            link.client.abort()
        pending = list(link.pending.values())
        link.pending.clear()
        for ack in pending:
            link.window.release()
            if not ack.done():
                ack.set_exception(
                    NotConnected(f"lost the connection to {self._where} before the acknowledgement")
                )
                # Nobody may be waiting any more (the caller timed out): don't warn about it.
                ack.exception()
        if link is not self._link or not self._connected:
            return
        self._connected = False
        self._ready.clear()
        if self._stopping:
            self._log.info("MQTT client %s disconnected from %s", self._client_id, self._where)
        else:
            self._log.warning(
                "MQTT client %s lost its connection to %s%s",
                self._client_id,
                self._where,
                _disconnect_detail(link.disconnect_reason),
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
        attempt = 0
        try:
            while not self._stopping:
                link: _Link | None = None
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
                        attempt = 0
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
                maximum = settings.reconnect_max_s
                if self._reconnect_ceiling is not None:
                    maximum = min(maximum, self._reconnect_ceiling)
                delay = backoff_delay(
                    attempt,
                    min(settings.reconnect_min_s, maximum),
                    maximum,
                    self._random.uniform,
                )
                attempt += 1
                if failure is not None:
                    self._last_error = failure
                    self._log.warning(
                        "MQTT client %s could not connect to %s: %s; retrying in %.2f s",
                        self._client_id,
                        self._where,
                        _describe(failure),
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

    async def _open_link(self) -> _Link:
        """Connect once: TCP, TLS, CONNECT and CONNACK, all within connect_timeout_s."""
        settings = self._settings
        connect_timeout = settings.connect_timeout_s
        if self._reconnect_ceiling is not None:
            # A black-holed attempt must not use up the time the ceiling is there to save.
            connect_timeout = min(connect_timeout, max(1.0, 4 * self._reconnect_ceiling))
        link = _Link()
        client = _GmqttClient(
            self._client_id,
            on_downgrade=functools.partial(self._on_downgrade, link),
            on_puback=functools.partial(self._on_puback, link),
        )
        link.client = client
        client.on_connect = functools.partial(self._on_connack, link)
        client.on_message = functools.partial(self._on_message, link)
        client.on_disconnect = functools.partial(self._on_gmqtt_disconnect, link)
        client.on_subscribe = functools.partial(self._on_suback, link)
        client.on_unsubscribe = functools.partial(self._on_suback, link)
        if settings.username is not None:
            password = settings.password.get_secret_value() if settings.password else None
            client.set_auth_credentials(settings.username, password)

        connect = asyncio.ensure_future(
            client.connect(
                settings.host,
                settings.port,
                ssl=self._ssl or False,
                keepalive=settings.keepalive_s,
                version=MQTTv50,
                raise_exc=True,
            )
        )
        lost = asyncio.ensure_future(link.lost.wait())
        ok = False
        try:
            done, _ = await asyncio.wait(
                (connect, lost),
                timeout=connect_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if link.refused_v5 or client.downgraded:
                raise _connack_error(_V311_UNACCEPTABLE_PROTOCOL)
            if connect in done:
                error = connect.exception()
                if isinstance(error, MQTTConnectError):
                    raise _connack_error(int(getattr(error, "_code", 0x80))) from None
                if error is not None:
                    raise error
                if link.lost.is_set():
                    raise NotConnected("the broker closed the connection right after CONNACK")
                ok = True
                return link
            if lost in done:
                hint = ""
                if self._ssl is not None and settings.tls.cert_file is None:
                    # What a broker that requires a client certificate looks like from here.
                    hint = " (does it require a client certificate? see mqtt.tls.cert_file)"
                raise NotConnected(f"the broker closed the connection before CONNACK{hint}")
            raise SessionTimeout(f"no CONNACK within {connect_timeout:g} s (connect_timeout_s)")
        finally:
            lost.cancel()
            if not ok:
                connect.cancel()
                # Let the cancellation land before closing what the attempt opened.
                await asyncio.wait((connect,))
                if not connect.cancelled():
                    connect.exception()  # retrieved: it was reported above, or is moot
                self._link_lost(link, None)

    async def _bring_up(self, link: _Link) -> None:
        """Make every subscription, count as connected, then run the on-connect hooks."""
        client = link.client
        assert client is not None
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
                        await self._send(link, functools.partial(_subscribe, link, subscription))
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
        self._log.error("MQTT client %s gives up on %s: %s", self._client_id, self._where, error)
        self._close()

    def _close(self) -> None:
        self._connected = False
        self._closed.set()
        self._ready.set()  # wake waiters so they see the end

    # --- internals: misc ---

    def _spawn(self, awaitable: Awaitable[None]) -> None:
        task = asyncio.ensure_future(awaitable)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _log_handler_error(self, callback: Handler, message: Message) -> None:
        self._log.exception(
            "MQTT client %s: handler %r failed on a message to %r",
            self._client_id,
            callback,
            message.topic,
        )


_BYTES_LIKE: Final = (bytes, bytearray, memoryview)


async def _await_until(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], deadline: float
) -> Any:
    """``await future``, raising TimeoutError once the loop time reaches ``deadline``.

    What ``async with asyncio.timeout_at(deadline): await future`` does, for less: on expiry
    the timer cancels ``future`` itself, which is what cancelling the waiting task would do
    to it, and the wait ends in TimeoutError. A cancellation of the task from elsewhere
    still ends it in CancelledError, as with asyncio.timeout_at().
    """
    task = asyncio.current_task(loop)
    cancelling = task.cancelling() if task is not None else 0
    expired = False

    def expire() -> None:
        nonlocal expired
        if not future.done():
            expired = True
            future.cancel()

    # As asyncio.Timeout schedules it: a deadline already past fires on the next iteration.
    if deadline <= loop.time():
        timer: asyncio.Handle = loop.call_soon(expire)
    else:
        timer = loop.call_at(deadline, expire)
    try:
        return await future
    except asyncio.CancelledError:
        if expired and (task is None or task.cancelling() <= cancelling):
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()


def _first(props: dict[str, Any], name: str) -> Any:
    """The value of a property as gmqtt hands it over (a list of values), or None."""
    values = props.get(name)
    return values[0] if isinstance(values, list) and values else None


def _subscribe(link: _Link, subscription: _Subscription) -> int:
    """Send the SUBSCRIBE for ``subscription`` on ``link``; return its packet id."""
    assert link.client is not None
    extra = (
        {"subscription_identifier": subscription.identifier}
        if link.subscription_identifiers
        else {}
    )
    return int(link.client.subscribe(subscription.topic_filter, qos=subscription.qos, **extra))


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "none"
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _disconnect_detail(reason: int | None) -> str:
    if reason is None:
        return ""
    if reason == _SESSION_TAKEN_OVER:
        return " (DISCONNECT 0x8E: another client connected with the same client id)"
    return f" (DISCONNECT 0x{reason:02X})"
