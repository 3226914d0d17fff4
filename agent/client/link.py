"""One network connection of the session and what is in flight on it.

Every request holding a packet id (QoS 1 PUBLISH, SUBSCRIBE, UNSUBSCRIBE) holds a permit of the
link's in-flight window from the moment it is sent until its acknowledgement or the loss of the
link, even when its caller stopped waiting: the packet id stays in use at the broker. The window
is the broker's Receive Maximum (from CONNACK), within our own cap, so that gmqtt never raises
``OverflowError`` and the broker never disconnects us for exceeding it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from agent.client.gmqtt_client import GmqttClient
from agent.client.session_errors import NotConnected


class Link:
    def __init__(self, where: str) -> None:
        self.where = where
        self.client: GmqttClient | None = None
        self.lost = asyncio.Event()
        self.refused_v5 = False
        self.disconnect_reason: int | None = None
        self.transport_error: BaseException | None = None  # what the connection ended with
        self.subscription_identifiers = True  # the CONNACK says otherwise if unsupported
        self.window = asyncio.Semaphore(1)  # replaced at CONNACK
        self.limit = 1
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.up_since = 0.0

    def connack(self, receive_maximum: int, subscription_identifiers: bool, cap: int) -> None:
        """Size the window from a successful CONNACK (``cap``: our own maximum in flight)."""
        self.subscription_identifiers = subscription_identifiers
        # gmqtt's packet id pool holds one id fewer than the Receive Maximum, and subscribe and
        # unsubscribe draw on the same pool; the window covers them all.
        id_pool = receive_maximum - 1 if receive_maximum >= 2 else 65534
        self.limit = max(1, min(cap, receive_maximum, id_pool))
        self.window = asyncio.Semaphore(self.limit)

    async def send(self, send: Callable[[], int | None]) -> asyncio.Future[Any]:
        """Send a request that takes a packet id, within the window.

        Returns the future of its acknowledgement. Raises NotConnected, having sent nothing,
        when the link is (or goes) down before there is room in the window.
        """
        await self.window.acquire()
        if self.lost.is_set() or self.client is None:
            self.window.release()
            raise NotConnected(f"not connected to {self.where}")
        try:
            mid = send()
        except BaseException:
            self.window.release()
            raise
        assert mid is not None
        ack: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[mid] = ack
        return ack

    def ended_with(self, error: BaseException) -> None:
        if self.transport_error is None:
            self.transport_error = error

    def acknowledged(self, mid: int, result: Any) -> None:
        ack = self.pending.pop(mid, None)
        if ack is None:
            return
        self.window.release()
        if not ack.done():
            ack.set_result(result)

    def mark_lost(self, reason: int | None) -> bool:
        """Record the loss (keeping the first DISCONNECT reason), drop the connection, fail
        what is in flight with NotConnected. Returns False when it was already lost."""
        if reason is not None and self.disconnect_reason is None:
            self.disconnect_reason = reason
        if self.lost.is_set():
            return False
        self.lost.set()
        if self.client is not None:
            self.client.abort()
        pending = list(self.pending.values())
        self.pending.clear()
        for ack in pending:
            self.window.release()
            if not ack.done():
                ack.set_exception(
                    NotConnected(f"lost the connection to {self.where} before the acknowledgement")
                )
                # Nobody may be waiting any more (the caller timed out): don't warn about it.
                ack.exception()
        return True
