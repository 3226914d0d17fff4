"""One network connection of the session: opening it, and what is in flight on it.

``open_link`` connects once (TCP, TLS, CONNECT, CONNACK) within a timeout, with a fresh gmqtt
client, and says why it could not: a CONNACK refusal, a TLS alert, a hang-up, a timeout. A
broker that hangs up on a plain CONNECT without a word is asked for a TLS handshake
(``speaks_tls``): a TLS port, what a plain client gets there (mosquitto, the emulator), is
then said at once, instead of a hang-up retried until the caller's time is up.

Every request holding a packet id (QoS 1 PUBLISH, SUBSCRIBE, UNSUBSCRIBE) holds a permit of the
link's in-flight window from the moment it is sent until its acknowledgement or the loss of the
link, even when its caller stopped waiting: the packet id stays in use at the broker. The window
is the broker's Receive Maximum (from CONNACK), within our own cap, so that gmqtt never raises
``OverflowError`` and the broker never disconnects us for exceeding it.

A connected link watches for a dead network path (a half-open TCP connection, a black hole):
once nothing has come from the broker for half a keep-alive, a PINGREQ goes out, and if still
nothing has come half a keep-alive after it, the link is declared dead and dropped. A link is
thus noticed dead within one keep-alive of the last packet received (gmqtt alone closes it only
after two keep-alives of silence, checked every half keep-alive: up to 2.5). The PINGREQ is
what makes a quiet but healthy broker answer; an answer, or any other packet, clears it.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.client.credentials import Credentials
from agent.client.gmqtt_client import GmqttClient
from agent.client.session_errors import (
    V311_UNACCEPTABLE_PROTOCOL,
    LostInFlight,
    NotConnected,
    SessionTimeout,
    SettingNames,
    TlsHangUp,
    TlsPortWithoutTls,
    connack_error,
    is_not_tls,
    own_names,
)
from agent.message import Message

if TYPE_CHECKING:
    from agent.config import MqttSettings


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
        self._watchdog: asyncio.Handle | None = None
        self._last_look = False
        self._pinged_at: float | None = None  # an unanswered PINGREQ of the watchdog
        self._on_dead: Callable[[], None] = lambda: None

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

    def watch(self, on_dead: Callable[[], None]) -> None:
        """Start the dead-link watchdog (see the module's docstring); ``on_dead`` is called
        once the link is declared dead, with ``transport_error`` saying why."""
        self._on_dead = on_dead
        self._check_alive()

    def _check_alive(self) -> None:
        self._watchdog = None
        client = self.client
        if self.lost.is_set() or client is None:
            return
        half = client.keepalive / 2
        if half <= 0:
            return  # the broker turned keep-alive off (Server Keep Alive 0)
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        heard = client.last_heard
        if self._pinged_at is None or heard >= self._pinged_at:
            # Nothing unanswered: ping once the broker has been quiet for half a keep-alive.
            self._pinged_at = None
            due = heard + half
            if now >= due:
                client.ping()
                self._pinged_at, due = now, now + half
        else:
            due = self._pinged_at + half
            if now >= due:
                if not self._last_look:
                    # What came while this process did not run (paused, a stalled loop) is
                    # read by gmqtt's reader task after this timer: one more turn lets it.
                    self._last_look = True
                    self._watchdog = loop.call_soon(self._check_alive)
                    return
                self.ended_with(
                    SessionTimeout(
                        f"no answer to a PINGREQ within {half:g} s, nothing received for "
                        f"{now - heard:.1f} s (keep-alive {2 * half:g} s): the link is dead"
                    )
                )
                self._on_dead()
                return
        self._last_look = False
        self._watchdog = loop.call_later(due - now, self._check_alive)

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
        what is in flight with LostInFlight. Returns False when it was already lost."""
        if reason is not None and self.disconnect_reason is None:
            self.disconnect_reason = reason
        if self.lost.is_set():
            return False
        self.lost.set()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self.client is not None:
            self.client.abort()
        pending = list(self.pending.values())
        self.pending.clear()
        for ack in pending:
            self.window.release()
            if not ack.done():
                ack.set_exception(
                    LostInFlight(f"lost the connection to {self.where} before the acknowledgement")
                )
                # Nobody may be waiting any more (the caller timed out): don't warn about it.
                ack.exception()
        return True


async def open_link(
    settings: MqttSettings,
    client_id: str,
    credentials: Credentials,
    ssl_context: ssl.SSLContext | None,
    *,
    connect_timeout: float,
    will: Message | None = None,
    on_message: Callable[[Link, Message, list[int]], None],
    on_undecodable: Callable[[Link], None],
    on_lost: Callable[[Link, int | None], None],
    names: SettingNames = own_names,
) -> Link:
    """Connect once: TCP, TLS, CONNECT and CONNACK, all within ``connect_timeout``.

    Returns the link, connected; raises ConnectionRefused (CONNACK), an OSError or SSLError
    (network, TLS), NotConnected (closed before CONNACK; TlsPortWithoutTls when the port
    speaks TLS) or SessionTimeout. ``on_lost`` is called for a link that fails here too, as
    for one lost later. Settings to check are named by ``names``.
    """
    where = f"{settings.host}:{settings.port}"
    link = Link(where)
    deadline = asyncio.get_running_loop().time() + connect_timeout

    def refused_v5() -> None:
        link.refused_v5 = True
        on_lost(link, None)

    client = GmqttClient(
        client_id,
        credentials=credentials,
        on_connack=lambda receive_maximum, ids: link.connack(
            receive_maximum, ids, settings.max_inflight
        ),
        on_message=lambda message, identifiers: on_message(link, message, identifiers),
        on_undecodable=lambda: on_undecodable(link),
        on_ack=link.acknowledged,
        on_lost=lambda reason: on_lost(link, reason),
        on_downgrade=refused_v5,
        on_transport_error=link.ended_with,
        will=will,
        names=names,
    )
    link.client = client
    connect = asyncio.ensure_future(
        client.open(
            settings.host, settings.port, ssl_context=ssl_context, keepalive=settings.keepalive_s
        )
    )
    lost = asyncio.ensure_future(link.lost.wait())
    ok = False
    try:
        done, _ = await asyncio.wait(
            (connect, lost), timeout=connect_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if link.refused_v5 or client.downgraded:
            raise connack_error(V311_UNACCEPTABLE_PROTOCOL)
        if connect in done:
            error = connect.exception()
            if error is not None:
                raise error
            if link.lost.is_set():
                raise NotConnected("the broker closed the connection right after CONNACK")
            ok = True
            link.watch(lambda: on_lost(link, None))
            return link
        if lost in done:
            if isinstance(link.transport_error, ssl.SSLError):
                raise link.transport_error  # a TLS alert: what went wrong, in its words
            if ssl_context is not None:
                # What a broker refusing our certificate (or the lack of one) looks like when
                # its alert is lost to the connection reset.
                raise TlsHangUp(settings.tls.cert_file is not None, names)
            # What a TLS port does with a plain CONNECT: closes without a word we can read.
            # A broker going down does so too, so ask the port before saying which it is.
            left = deadline - asyncio.get_running_loop().time()
            if await speaks_tls(settings.host, settings.port, timeout=min(left, TLS_PROBE_S)):
                raise TlsPortWithoutTls(names)
            raise NotConnected("the broker closed the connection before CONNACK")
        timeout = names("mqtt.connect_timeout_s")
        if ssl_context is not None and not client.transport_up:
            # A port without TLS that waits for more of what it takes for a CONNECT.
            raise SessionTimeout(
                f"the TLS handshake did not finish within {connect_timeout:g} s "
                f"({timeout}; a port without TLS?)"
            )
        raise SessionTimeout(f"no CONNACK within {connect_timeout:g} s ({timeout})")
    finally:
        lost.cancel()
        if not ok:
            connect.cancel()
            try:
                # Let the cancellation land before closing what the attempt opened.
                await asyncio.wait((connect,))
            finally:
                # Closed even if this wait is cancelled in turn (a session stopped as the
                # attempt gave up): the connection was left half-open, its CONNECT sent.
                if connect.done() and not connect.cancelled():
                    connect.exception()  # retrieved: it was reported above, or is moot
                on_lost(link, None)


TLS_PROBE_S = 2.0
"""At most this long for a port that hung up on a plain CONNECT to answer a TLS handshake."""


async def speaks_tls(host: str, port: int, *, timeout: float) -> bool:
    """Whether ``host:port`` answers a TLS handshake (its certificate not looked at): a
    handshake that completes, or that the server ends with an alert of its own (a client
    certificate it requires), is TLS; a record that is not TLS, a hang-up, nothing within
    ``timeout``, is not."""
    if timeout <= 0:
        return False
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # nothing is trusted or sent over it: a yes or a no
    context.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port, ssl=context)
    except ssl.SSLError as exc:
        return not is_not_tls(exc)
    except (OSError, TimeoutError):
        return False
    writer.transport.abort()
    return True


async def wait_until(
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
