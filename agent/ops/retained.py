"""Retained messages, read as a snapshot and followed: what the agents say about themselves.

MQTT has no "end of retained messages". A broker sends a subscription's retained messages
right after its SUBACK, before anything it routes to the same client later, so a message
this client publishes to itself afterwards arrives after all of them: `settle()` waits for
that echo. A broker that does not let us publish there gets a short quiet period instead.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from agent.client.session import Session, SessionError
from agent.message import Message

log = logging.getLogger(__name__)

QUIET_S = 0.3
"""Without an echo: how long the retained messages are given to arrive."""
MAX_MESSAGES = 10_000
"""A bound on what is kept (one message a topic)."""


class Retained:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.messages: dict[str, Message] = {}
        self.changed = asyncio.Event()
        self._echo_topic = f"clients/{session.client_id}/status-sync"
        self._echoes: dict[bytes, asyncio.Event] = {}
        self._echo_subscribed: bool | None = None
        self._listeners: list[Callable[[Message], None]] = []

    def on_message(self, listener: Callable[[Message], None]) -> None:
        self._listeners.append(listener)

    async def follow(self, topic_filter: str) -> None:
        """Keeps the newest message of every topic matching `topic_filter` (SUBACK awaited)."""
        await self.session.subscribe(topic_filter, self._take)

    def _take(self, message: Message) -> None:
        if not message.payload:
            self.messages.pop(message.topic, None)  # a retained message cleared
        elif message.topic in self.messages or len(self.messages) < MAX_MESSAGES:
            self.messages[message.topic] = message
        for listener in self._listeners:
            listener(message)
        self.changed.set()

    async def settle(self, timeout: float = 2.0) -> None:
        """Returns once the retained messages of every filter followed so far are in."""
        if self._echo_subscribed is None:
            try:
                await self.session.subscribe(self._echo_topic, self._echo, timeout=timeout)
                self._echo_subscribed = True
            except SessionError as exc:
                log.debug("no echo topic (%s): waiting a quiet period instead", exc)
                self._echo_subscribed = False
        if self._echo_subscribed:
            marker = uuid.uuid4().hex.encode()
            arrived = self._echoes[marker] = asyncio.Event()
            try:
                await self.session.publish(self._echo_topic, marker, qos=1, timeout=timeout)
                async with asyncio.timeout(timeout):
                    await arrived.wait()
                return
            except (SessionError, TimeoutError) as exc:
                log.debug("no echo (%s): waiting a quiet period instead", exc)
            finally:
                self._echoes.pop(marker, None)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:  # a chatty topic must not keep us here
            self.changed.clear()
            try:
                async with asyncio.timeout(QUIET_S):
                    await self.changed.wait()
            except TimeoutError:
                return

    def _echo(self, message: Message) -> None:
        arrived = self._echoes.get(message.payload)
        if arrived is not None:
            arrived.set()
