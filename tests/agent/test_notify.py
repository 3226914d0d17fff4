"""The systemd notify protocol, for real: a NOTIFY_SOCKET listener in the test, the agent
as a process (and once in this process, to stall its event loop)."""

from __future__ import annotations

import asyncio
import itertools
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.config import AgentSettings
from agent.runtime.agent import Agent
from agent.runtime.notify import Notifier
from tests.support.events import first_to_come
from tests.support.rig import ACTIVE, DEVICE, Rig

# sockaddr_un holds 108 bytes; stay well below.
MAX_SOCKET_PATH = 100
NOT_CONNECTING = re.compile(r"could not connect to")


@dataclass(frozen=True)
class Notification:
    at: float
    """time.monotonic() when the listener received it."""
    fields: dict[str, str]


def _parse(payload: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in payload.decode().splitlines():
        name, _, value = line.partition("=")
        fields[name] = value
    return fields


class NotifyListener:
    """What systemd does with $NOTIFY_SOCKET: a datagram socket, read by a thread that
    timestamps every message."""

    def __init__(self, directory: Path, name: str) -> None:
        self._own_directory: str | None = None
        path = directory / name
        if len(str(path).encode()) >= MAX_SOCKET_PATH:
            self._own_directory = tempfile.mkdtemp(prefix="n")
            path = Path(self._own_directory) / name
        self.address = str(path)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(self.address)
        self._socket.settimeout(0.05)  # lets the thread notice close()
        self.received: list[Notification] = []
        self._marks = 0
        self._changed = threading.Condition()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._closing.is_set():
            try:
                payload = self._socket.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            notification = Notification(time.monotonic(), _parse(payload))
            with self._changed:
                self.received.append(notification)
                self._changed.notify_all()

    def snapshot(self) -> list[Notification]:
        """What the thread has received so far (see settled)."""
        with self._changed:
            return list(self.received)

    def settled(self) -> list[Notification]:
        """Everything sent to the socket before this call, once the thread has received it:
        a datagram socket keeps its order, so a mark sent now arrives after all of it."""
        self._marks += 1
        mark = str(self._marks)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.sendto(f"TEST_MARK={mark}".encode(), self.address)
        self.wait_for(lambda n: n.fields.get("TEST_MARK") == mark)
        return [n for n in self.snapshot() if "TEST_MARK" not in n.fields]

    def wait_for(
        self, predicate: Callable[[Notification], bool], timeout: float = 10.0
    ) -> Notification:
        """The first notification (received so far or later) that satisfies predicate."""
        return first_to_come(
            self._changed,
            self.received,
            predicate,
            timeout,
            lambda: TimeoutError(f"no such notification; received {self.received}"),
        )

    def close(self) -> None:
        self._closing.set()
        self._thread.join(5)
        self._socket.close()
        if self._own_directory is not None:
            shutil.rmtree(self._own_directory, ignore_errors=True)


def is_ready(n: Notification) -> bool:
    return n.fields.get("READY") == "1"


def is_ping(n: Notification) -> bool:
    return n.fields.get("WATCHDOG") == "1"


def is_active(n: Notification) -> bool:
    """The status line once the agent is active and its device in sync."""
    return n.fields.get("STATUS") == f"active for {DEVICE}: in sync"


@pytest.fixture
def listen(tmp_path: Path) -> Iterator[Callable[[str], NotifyListener]]:
    listeners: list[NotifyListener] = []

    def make(name: str) -> NotifyListener:
        listener = NotifyListener(tmp_path, name)
        listeners.append(listener)
        return listener

    try:
        yield make
    finally:
        for listener in listeners:
            listener.close()


def test_ready_at_once_and_the_status_line_says_what_the_start_waits_for(
    rig: Rig, listen: Callable[[str], NotifyListener]
) -> None:
    """With the broker down, `systemctl start` hung for TimeoutStartSec: the agent waited
    for the broker before it said READY. It says READY as it runs, and the truth in STATUS."""
    notify = listen("a")
    rig.broker_down()
    agent = rig.start_agent("a", NOTIFY_SOCKET=notify.address, WATCHDOG_USEC="400000")
    broker = f"127.0.0.1:{rig.port}"  # which one: it is said
    ready = notify.wait_for(is_ready)
    assert ready.fields["STATUS"] == f"connecting to the broker {broker}"
    failing = notify.wait_for(lambda n: "failing since" in n.fields.get("STATUS", ""))
    assert re.fullmatch(
        rf"connecting to the broker {re.escape(broker)}; failing since \d\d:\d\d:\d\d UTC: "
        r"connection refused: .*",
        failing.fields["STATUS"],
    ), failing.fields
    # Two failed attempts: the watchdog is fed all the while (the loop turns).
    agent.wait_for_new(NOT_CONNECTING)
    agent.wait_for_new(NOT_CONNECTING)
    pings = [n for n in notify.settled() if is_ping(n)]
    assert pings and pings[0].at - ready.at < 0.4, pings

    rig.broker_up()
    active = notify.wait_for(is_active)
    agent.wait_for_new(ACTIVE)  # logged before the status line said so
    agent.wait_for_new(re.compile("started as active"))
    assert [n for n in notify.settled() if is_ready(n)] == [ready], "READY is said once"
    assert active.at > failing.at

    other = listen("b")
    standby = rig.start_agent("b", NOTIFY_SOCKET=other.address)
    other.wait_for(lambda n: n.fields.get("STATUS") == f"standby for {DEVICE}")
    standby.wait_for_new(re.compile("started as standby"))
    # Without WATCHDOG_USEC there is no watchdog to feed.
    assert not any(is_ping(n) for n in other.settled())


def test_watchdog_pings_at_half_the_configured_timeout(
    rig: Rig, listen: Callable[[str], NotifyListener]
) -> None:
    notify = listen("a")
    # A timeout of 1 s: a loaded machine delayed a ping (or the listener's read of it) by
    # 0.2 s, which a timeout of 0.4 s, pinged every 0.2 s, does not leave room for.
    rig.start_agent("a", NOTIFY_SOCKET=notify.address, WATCHDOG_USEC="1000000")
    ready = notify.wait_for(is_ready)
    first = notify.wait_for(lambda n: is_ping(n) and n.at >= ready.at)
    window = 5.0  # ten periods of 0.5 s
    notify.wait_for(lambda n: is_ping(n) and n.at >= first.at + window, timeout=window + 10)
    pings = [
        n.at for n in notify.snapshot() if is_ping(n) and first.at <= n.at <= first.at + window
    ]
    # Expected: one at the start of the window and one every 0.5 s after it.
    assert 8 <= len(pings) <= 13, pings
    gaps = [later - earlier for earlier, later in itertools.pairwise(pings)]
    # A gap as long as WATCHDOG_USEC would get the service killed.
    assert max(gaps) < 1.0, gaps


async def test_stalled_event_loop_stops_the_watchdog_pings(
    rig: Rig, listen: Callable[[str], NotifyListener], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long lease, so that the stall below costs nothing but the pings.
    for name, value in rig.env("a", AGENT_LOCK__TTL_MS="10000").items():
        monkeypatch.setenv(name, value)
    settings = AgentSettings()  # type: ignore[call-arg]
    notify = listen("a")
    notifier = Notifier({"NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": "200000"})
    stop = asyncio.Event()
    running = asyncio.create_task(Agent(settings, notifier=notifier).run(stop))
    try:
        ready = await asyncio.to_thread(notify.wait_for, is_active)
        await asyncio.to_thread(notify.wait_for, lambda n: is_ping(n) and n.at > ready.at)
        await asyncio.to_thread(notify.wait_for, lambda n: is_ping(n) and n.at > ready.at + 0.2)

        stalled_at = time.monotonic()
        time.sleep(1.5)  # noqa: ASYNC251 - the stall under test: the loop runs nothing
        resumed_at = time.monotonic()

        after = await asyncio.to_thread(
            notify.wait_for, lambda n: is_ping(n) and n.at >= resumed_at, 2.0
        )
        # A ping already on its way when the stall began may land a moment later.
        during = [n.at - stalled_at for n in notify.settled() if is_ping(n)]
        assert [t for t in during if 0.05 < t < resumed_at - stalled_at] == []
        assert after.at - resumed_at < 0.5
        # And they keep coming at the configured rate.
        await asyncio.to_thread(
            notify.wait_for, lambda n: is_ping(n) and n.at >= after.at + 0.05, 1.0
        )
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 10) == 0
        notifier.close()


@pytest.mark.slow  # two agents, a broker that goes and comes back: seconds
def test_the_status_line_says_what_is_wrong_since_when_naming_the_broker_or_the_port(
    rig: Rig, listen: Callable[[str], NotifyListener]
) -> None:
    """`systemctl status` said `standby for ...` on both gateways while their health said
    they were failing: the status line is the truth too."""
    notify = listen("a")
    rig.start_agent("a", NOTIFY_SOCKET=notify.address)
    notify.wait_for(is_active)
    other = listen("b")
    rig.start_agent("b", NOTIFY_SOCKET=other.address, AGENT_SERIAL__URL="/dev/ttyNOPE0")
    failing = r"; failing since \d\d:\d\d:\d\d UTC: "

    def says(listener: NotifyListener, pattern: str) -> Notification:
        said = listener.wait_for(lambda n: "failing since" in n.fields.get("STATUS", ""))
        assert re.fullmatch(pattern, said.fields["STATUS"]), said.fields
        return said

    says(other, rf"standby for {DEVICE}{failing}cannot take over: .*/dev/ttyNOPE0.*")
    rig.broker_down()
    broker = re.escape(f"127.0.0.1:{rig.port}")
    gone = says(notify, rf"\w+ for {DEVICE}.*{failing}not connected to the broker {broker}")
    rig.broker_up()
    notify.wait_for(
        lambda n: n.at > gone.at and "STATUS" in n.fields and "failing" not in n.fields["STATUS"]
    )


def test_sigterm_sends_stopping(rig: Rig, listen: Callable[[str], NotifyListener]) -> None:
    notify = listen("a")
    agent = rig.start_agent("a", NOTIFY_SOCKET=notify.address, WATCHDOG_USEC="400000")
    ready = notify.wait_for(is_active)
    agent.signal(signal.SIGTERM)
    stopping = notify.wait_for(lambda n: n.fields.get("STOPPING") == "1")
    assert stopping.at > ready.at
    assert stopping.fields["STATUS"] == "stopping"
    assert agent.proc.wait(10) == 0
    agent.wait_for_new(re.compile("released the lock"))
    # Nothing claims readiness again on the way out.
    assert not any(is_ready(n) for n in notify.settled() if n.at > stopping.at)


def test_sigterm_while_connecting_stops_at_once_and_quietly(
    rig: Rig, listen: Callable[[str], NotifyListener]
) -> None:
    """Ready before the broker answers, so `systemctl stop` may come while it connects."""
    notify = listen("a")
    rig.broker_down()
    agent = rig.start_agent("a", NOTIFY_SOCKET=notify.address)
    notify.wait_for(is_ready)
    agent.wait_for_new(NOT_CONNECTING)
    agent.signal(signal.SIGTERM)
    assert notify.wait_for(lambda n: n.fields.get("STOPPING") == "1").fields["STATUS"] == "stopping"
    assert agent.proc.wait(10) == 0
    agent.drain()
    assert not [line for line in agent.lines if "Traceback" in line or "ERROR" in line]
