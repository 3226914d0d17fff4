"""Subscriptions and the handlers messages are delivered to.

Plain functions run synchronously as the message is read, before anything else can happen, so
a response handler can never be held up by another handler. Coroutine functions get their own
bounded queue and task: messages reach each of them in order, one at a time, and a handler that
awaits a request whose response arrives through the session does not block anything else (only
a handler awaiting a message that would be delivered to itself could wait on itself).

A coroutine handler that falls behind by ``queue_limit`` messages loses the oldest of them: the
session cannot push back on the broker without holding up every other handler, and for the
state-like messages of this project the newest is the one that matters. The first drop of a
backlog is logged as a warning, the catch-up with the count dropped when the queue is empty
again; ``HandlerEntry.dropped`` counts them, and ``on_drop`` is called for each.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeAlias

from agent.message import Message

Handler: TypeAlias = Callable[[Message], Awaitable[None] | None]
Logger: TypeAlias = logging.Logger | logging.LoggerAdapter[logging.Logger]

DEFAULT_QUEUE_LIMIT = 1000


class HandlerEntry:
    """One registered handler of one subscription."""

    def __init__(
        self,
        callback: Handler,
        *,
        client_id: str,
        log: Logger,
        spawn: Callable[[Awaitable[None]], None],
        queue_limit: int = DEFAULT_QUEUE_LIMIT,
        on_drop: Callable[[], None] = lambda: None,
    ) -> None:
        if queue_limit < 1:
            raise ValueError("queue_limit must be at least 1")
        self.callback = callback
        self._client_id = client_id
        self._log = log
        self._spawn = spawn
        self._on_drop = on_drop
        self._queue: asyncio.Queue[Message] | None = (
            asyncio.Queue(queue_limit) if inspect.iscoroutinefunction(callback) else None
        )
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.dropped = 0
        self._dropped_in_backlog = 0

    def deliver(self, message: Message) -> None:
        if self._closed:
            return  # unsubscribed while this message was being dispatched
        if self._queue is not None:
            self._enqueue(self._queue, message)
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._serve(self._queue))
            return
        try:
            result = self.callback(message)
        except Exception:
            self._log_error(message)
            return
        if result is not None and inspect.isawaitable(result):
            # A plain function that returned an awaitable: run it, but do not wait for it.
            self._spawn(self._await(result, message))

    def _enqueue(self, queue: asyncio.Queue[Message], message: Message) -> None:
        if queue.full():
            queue.get_nowait()  # the oldest
            self.dropped += 1
            self._dropped_in_backlog += 1
            self._on_drop()
            if self._dropped_in_backlog == 1:
                self._log.warning(
                    "MQTT client %s: handler %r is %d messages behind on %r: dropping the oldest",
                    self._client_id,
                    self.callback,
                    queue.maxsize,
                    message.topic,
                )
        queue.put_nowait(message)

    async def _await(self, awaitable: Awaitable[None], message: Message) -> None:
        try:
            await awaitable
        except Exception:
            self._log_error(message)

    async def _serve(self, queue: asyncio.Queue[Message]) -> None:
        while not self._closed:  # a handler may unsubscribe itself from inside this task
            if queue.empty() and self._dropped_in_backlog:
                self._log.warning(
                    "MQTT client %s: handler %r caught up, having lost %d messages",
                    self._client_id,
                    self.callback,
                    self._dropped_in_backlog,
                )
                self._dropped_in_backlog = 0
            message = await queue.get()
            try:
                await self.callback(message)  # type: ignore[misc]
            except Exception:
                self._log_error(message)

    def _log_error(self, message: Message) -> None:
        self._log.exception(
            "MQTT client %s: handler %r failed on a message to %r",
            self._client_id,
            self.callback,
            message.topic,
        )

    def close(self) -> asyncio.Task[None] | None:
        """Stop delivering; return the task to await if it was cancelled."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            return task
        return None


@dataclass(eq=False)
class Subscription:
    topic_filter: str
    qos: int
    # MQTT 5 Subscription Identifier: the broker tags each message with the identifiers of the
    # subscriptions it was sent for. mosquitto sends one copy per matching subscription when
    # filters overlap, so matching topics alone would hand every copy to every handler.
    identifier: int
    handlers: list[HandlerEntry] = field(default_factory=list)
