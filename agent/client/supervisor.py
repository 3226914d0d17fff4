"""Keeping the session connected: one link after another, until it stops or fails for good.

The supervisor task opens a link (``open_link``: TCP, TLS, CONNECT, CONNACK, within
``connect_timeout_s``), brings it up (every subscription made again and SUBACKed, the session
counted as connected, the on-connect hooks run in registration order), waits for its loss and
opens the next one after a delay of the backoff: exponential with full jitter, within the
reconnect ceiling when one is set, started from the bottom again only after a link that stayed
up for ``reconnect_max_s``. A refusal that retrying cannot fix (MQTT 5 refused, bad credentials)
ends the session with its error; so does a definitive failure before the first connection when
the session was started with ``fail_fast``.

It holds what requests look at: the current link, whether the session is connected, the fatal
error, and the events a waiter wakes on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeAlias

from agent.backoff import Backoff
from agent.client.credentials import exposed_secret, read_credentials
from agent.client.handlers import Logger
from agent.client.link import Link, open_link
from agent.client.session_errors import (
    ConnectFailed,
    ConnectionRefused,
    NotConnected,
    SessionError,
    SessionTimeout,
    SettingNames,
    SubscribeFailed,
    describe_connect_failure,
    disconnect_detail,
    is_definitive,
    own_names,
)
from agent.client.subscriptions import Subscriptions, send_subscribe
from agent.message import Message

if TYPE_CHECKING:
    from agent.config import MqttSettings

ConnectHook: TypeAlias = Callable[[], Awaitable[None]]
DisconnectHook: TypeAlias = Callable[[], None]


class Supervisor:
    """The connection of one session: its supervisor task, its current link and its state."""

    def __init__(
        self,
        settings: MqttSettings,
        *,
        client_id: str,
        will: Message | None,
        log: Logger,
        backoff: Backoff,
        ssl_context: ssl.SSLContext | None,
        subscriptions: Subscriptions,
        names: SettingNames = own_names,
    ) -> None:
        self._settings = settings
        self._names = names
        self._client_id = client_id
        self._will = will
        self._log = log
        self._backoff = backoff
        self._ssl = ssl_context
        self._where = f"{settings.host}:{settings.port}"
        self._subscriptions = subscriptions
        self.connect_hooks: list[ConnectHook] = []
        self.disconnect_hooks: list[DisconnectHook] = []

        self._task: asyncio.Task[None] | None = None
        self._link: Link | None = None
        self._connected = False
        self._stopping = False
        self._error: SessionError | None = None
        self._last_error: BaseException | None = None
        # Set whenever there is something for a waiter to look at: connected, or closed.
        self._ready = asyncio.Event()
        self._first_up = asyncio.Event()
        self._closed = asyncio.Event()
        self.reconnect_ceiling: float | None = None
        self._fail_fast = False
        self._start_waiting = False

    @property
    def where(self) -> str:
        """The broker, as ``host:port``."""
        return self._where

    @property
    def link(self) -> Link | None:
        """The current link: up, being brought up, or lost (None before the first)."""
        return self._link

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def error(self) -> SessionError | None:
        return self._error

    @property
    def connect_failure(self) -> str | None:
        """Why the last attempt to connect failed, in words, while not connected."""
        failure = self._last_error
        if self._connected or failure is None:
            return None
        return describe_connect_failure(failure, self._names)

    # --- start and stop ---

    def start(self, *, fail_fast: bool) -> None:
        """Start the supervisor task (once only)."""
        if self._task is not None or self._closed.is_set():
            raise RuntimeError("a session can be started only once")
        self._fail_fast = fail_fast
        self._task = asyncio.get_running_loop().create_task(
            self._supervise(), name=f"mqtt-session-{self._client_id}"
        )

    async def wait_started(self, timeout: float | None) -> SessionError | None:
        """Wait until the first connection is up and its on-connect hooks have run (None),
        or until the session ends or ``timeout`` passes: the error that says why not."""
        up = asyncio.ensure_future(self._first_up.wait())
        closed = asyncio.ensure_future(self._closed.wait())
        self._start_waiting = True
        try:
            await asyncio.wait((up, closed), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._start_waiting = False
            up.cancel()
            closed.cancel()
        if self._first_up.is_set():
            return None
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
            described = describe_connect_failure(failure, self._names) if failure else ""
            last = f" (last error: {described})" if failure else ""
            error = SessionTimeout(f"could not connect to {self._where} within {timeout} s{last}")
        return error

    async def stop(self) -> asyncio.Task[None] | None:
        """Send DISCONNECT and stop reconnecting; return the supervisor task, cancelled, for
        the caller to await (None when there is none, or it is the caller)."""
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
        supervisor, self._task = self._task, None
        if supervisor is not None and supervisor is not asyncio.current_task():
            supervisor.cancel()
            return supervisor
        return None

    async def wait_closed(self) -> None:
        """Wait until the session ends; raise the fatal error if that is why it ended."""
        await self._closed.wait()
        if self._error is not None:
            raise self._error

    def drop_link(self, why: str) -> None:
        """Reset the current link at once; the next one follows as after any loss."""
        link = self._link
        if link is None or link.lost.is_set():
            return
        link.ended_with(SessionError(why))
        self._link_lost(link, None)

    # --- the link requests go on ---

    def current_link(self) -> Link:
        """The link to send on now; raise the fatal error, or NotConnected while down."""
        if self._error is not None:
            raise self._error
        link = self._link
        if not self._connected or link is None:
            raise NotConnected(f"not connected to {self._where}")
        return link

    async def ready_link(self) -> Link:
        """The link to send on once connected; raise the fatal error, or NotConnected once
        stopped."""
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
                or (f": {describe_connect_failure(error, self._names)}" if error else ""),
            )
        for hook in list(self.disconnect_hooks):
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
                "MQTT client %s sends %s to %s without TLS: anyone on the way can read it (set %s)",
                self._client_id,
                secret,
                self._where,
                self._names("mqtt.tls.enabled"),
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
                    said = describe_connect_failure(failure, self._names)
                    self._fail(ConnectFailed(said, failure))
                    return
                delay = self._backoff.next_delay(ceiling=self.reconnect_ceiling)
                if failure is not None:
                    self._last_error = failure
                    self._log.warning(
                        "MQTT client %s could not connect to %s: %s; retrying in %.2f s",
                        self._client_id,
                        self._where,
                        describe_connect_failure(failure, self._names),
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
                self.close()

    async def _open_link(self) -> Link:
        """Connect once: TCP, TLS, CONNECT and CONNACK, all within connect_timeout_s."""
        settings = self._settings
        connect_timeout = settings.connect_timeout_s
        if self.reconnect_ceiling is not None:
            # A black-holed attempt must not use up the time the ceiling is there to save.
            connect_timeout = min(connect_timeout, max(1.0, 2 * self.reconnect_ceiling))
        # The token file is read anew for every attempt (rotation), in a thread (file I/O).
        if settings.sat_file is not None:
            credentials = await asyncio.to_thread(read_credentials, settings, self._names)
        else:
            credentials = read_credentials(settings, self._names)
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
            names=self._names,
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
        for hook in list(self.connect_hooks):
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
        self.close()

    def close(self) -> None:
        """The session is over: no longer connected, and every waiter wakes to see it."""
        self._connected = False
        self._closed.set()
        self._ready.set()  # wake waiters so they see the end
