"""The state store service: moves requests from MQTT into the pure `StateStore` and its
replies and notifications back out.

With a journal (``--data-dir``), what a request caused goes out only once the records made
before its reply are kept (``journal.durable``): its reply and notifications are held, in
order, until then. A reply held behind a record that could not be kept (a full disk) is
answered ``-ERR the store cannot write to its disk`` instead, the store having taken the
record's change back, and its notifications are dropped: nobody learns of a change the
store does not keep.

`StoreService` knows nothing of how messages arrive. Two hosts drive it:
- the embedded broker (`embedded.py`), which tells it each sender's client id and every
  disconnect, as the real broker does;
- an external broker (`external.py`), where it is an ordinary client that trusts the
  request's `__srcId` and learns of disconnects from the broker's log topic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from agent.emulator.store import DISK_FAILED, KeyNotification, Outcome, Reply, StateStore
from agent.message import Message
from agent.protocol import topics
from agent.protocol.resp3 import ErrorReply, encode_response

log = logging.getLogger(__name__)

# The answer to a request the store failed on: clients keep an unknown text as a generic
# service error (protocol.md §2), and an answer, even this one, beats a timeout.
INTERNAL_ERROR = "internal error"
_INTERNAL_ERROR_REPLY = encode_response(ErrorReply(INTERNAL_ERROR))
_DISK_FAILED_REPLY = encode_response(ErrorReply(DISK_FAILED))
# After expire() failed, when to try again (it is retried, never given up).
_EXPIRY_RETRY_S = 0.1


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class _Held:
    """What one request (or one expiry) caused, waiting for record ``record`` to be kept."""

    record: int
    request: Message | None
    reply: Reply | None
    notifications: list[KeyNotification]


class StoreService:
    def __init__(
        self,
        store: StateStore,
        publish: Callable[[Message], None],
        disconnect: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self._publish = publish
        self._disconnect = disconnect
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expiry_deadline: int | None = None
        # Bounded by what the clients may have in flight (the broker's receive maximum).
        self._held: deque[_Held] = deque()
        self._closed = False

    def on_request(self, sender: str | None, message: Message) -> None:
        """Executes one PUBLISH on the invoke topic. `sender` is None when unknown."""
        client_id = sender if sender is not None else message.user_property(topics.SOURCE_ID)
        if message.response_topic is None or message.correlation_data is None:
            log.warning("request from %s without response topic or correlation data", client_id)
            return
        if topics.is_forbidden_response_topic(message.response_topic):
            log.warning(
                "request from %s names forbidden response topic %s",
                client_id,
                message.response_topic,
            )
            if self._disconnect is not None and sender is not None:
                self._disconnect(sender)
            return
        if message.qos != 1:
            log.warning("request from %s at QoS %d not executed", client_id, message.qos)
            return
        # Keys whose time ran out before this request (their timer not yet run) expire first,
        # and their DELETE goes out before its reply, as from a store that expires keys on
        # time: a standby granted a lock whose lease just ran out learns of the expiry before
        # the grant, not after it (it would then wait out a lease that is already over).
        self._send_expired()
        try:
            outcome = self.store.handle(
                client_id or "",
                message.payload,
                message.user_property(topics.TIMESTAMP),
                message.user_property(topics.FENCING_TOKEN),
            )
        except Exception:
            log.exception(
                "request from %s failed in the store; answered %r", client_id, INTERNAL_ERROR
            )
            outcome = Outcome(Reply(_INTERNAL_ERROR_REPLY, self.store.clock.current))
        self._out(message, outcome.reply, outcome.notifications)
        self._schedule_expiry()

    def _out(
        self,
        request: Message | None,
        reply: Reply | None,
        notifications: list[KeyNotification],
    ) -> None:
        """Sends a reply and notifications now, or once the records before them are kept."""
        journal = self.store.journal
        if journal is not None and (self._held or journal.appended > journal.durable):
            self._held.append(_Held(journal.appended, request, reply, notifications))
            return
        self._deliver(request, reply, notifications)

    def _deliver(
        self,
        request: Message | None,
        reply: Reply | None,
        notifications: list[KeyNotification],
    ) -> None:
        if request is not None and reply is not None:
            self._send(self._response(request, reply))
        for notification in notifications:
            self._send(self._notification(notification))

    def on_kept(self, kept: int, error: OSError | None) -> None:
        """The journal's listener: records up to ``kept`` are kept; with ``error``, the
        ones after it could not be, and what waits on them is answered with the error."""
        self.store.kept(kept)
        if self._closed:
            return
        held = self._held
        while held and held[0].record <= kept:
            item = held.popleft()
            self._deliver(item.request, item.reply, item.notifications)
        if error is None:
            return
        taken_back = self.store.take_back(kept)
        answered = len(held)
        while held:
            item = held.popleft()
            if item.request is not None and item.reply is not None:
                failed = Reply(_DISK_FAILED_REPLY, item.reply.timestamp)
                self._send(self._response(item.request, failed))
        log.error(
            "%d changes taken back and %d requests answered %r: their records could not be "
            "written (%s)",
            taken_back,
            answered,
            DISK_FAILED,
            error,
        )

    def _send_expired(self) -> bool:
        """Expires what is due and notifies it; False (said in the log) if the store could
        not: a request is still executed (it expires keys again, and a failure there is
        answered), and the timer tries again."""
        try:
            notifications = self.store.expire()
        except Exception:
            log.exception("expiring keys failed; retrying in %s s", _EXPIRY_RETRY_S)
            return False
        if notifications:
            self._out(None, None, notifications)
        return True

    def _send(self, message: Message) -> None:
        try:
            self._publish(message)
        except Exception:
            log.exception("could not publish to %s", message.topic)

    def on_client_gone(self, client_id: str) -> None:
        self.store.client_gone(client_id)

    def close(self) -> None:
        """Stops sending: what is held when the broker stops was never acknowledged."""
        self._held.clear()
        self._closed = True
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None

    # ------------------------------------------------------------------ expiry

    def _schedule_expiry(self) -> None:
        """Keeps one timer armed for the earliest deadline (active expiry, protocol.md §7)."""
        deadline = self.store.next_expiry_ms()
        if deadline == self._expiry_deadline:
            return
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        self._expiry_deadline = deadline
        if deadline is not None:
            delay = max(0.0, (deadline - monotonic_ms()) / 1000)
            self._expiry_timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self._expiry_timer = None
        self._expiry_deadline = None
        if not self._send_expired():
            self._expiry_timer = asyncio.get_running_loop().call_later(
                _EXPIRY_RETRY_S, self._expire
            )
            return
        self._schedule_expiry()

    # ------------------------------------------------------------------ messages

    @staticmethod
    def _response(request: Message, reply: Reply) -> Message:
        properties = [
            (topics.STATUS, "200"),
            (topics.PROTOCOL_VERSION_PROPERTY, topics.PROTOCOL_VERSION),
        ]
        if reply.timestamp is not None:
            properties.append((topics.TIMESTAMP, str(reply.timestamp)))
        assert request.response_topic is not None
        return Message(
            topic=request.response_topic,
            payload=reply.payload,
            qos=1,
            correlation_data=request.correlation_data,
            content_type=topics.CONTENT_TYPE,
            user_properties=properties,
        )

    @staticmethod
    def _notification(notification: KeyNotification) -> Message:
        return Message(
            topic=topics.notify_topic(notification.client_id, notification.key),
            payload=notification.payload,
            qos=1,
            content_type=topics.CONTENT_TYPE,
            user_properties=[
                (topics.TIMESTAMP, str(notification.timestamp)),
                (topics.PROTOCOL_VERSION_PROPERTY, topics.PROTOCOL_VERSION),
            ],
        )
