"""Figures: abusive clients against `agent emulator`, and a well-behaved client meanwhile.

    python -m tests.bench.bench_abuse [--requests N] [--only CASE ...]

Each case gets a fresh emulator process (the embedded broker with its default limits) and
measures, in the same run:
- the well-behaved client: sequential store GETs (a lean gmqtt client, as in
  bench_store.py), p50 and p99 latency while the abuse goes on, beside the anchor (the
  same client with no abuse, measured first in this run);
- the broker's resident memory (VmRSS) before the abuse and at its end;
- what the broker did about the abuser.

Bounds: the well-behaved client's p99 stays within 20 ms (its anchor is printed beside
it) and the broker's memory grows by at most 32 MB per case. Abusers run as threads on
blocking sockets in a process of their own, and the broker in another, so that only the
broker's own work stands between the well-behaved client and its answers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent.emulator import mqtt_packets as mp
from agent.protocol import topics
from agent.protocol.resp3 import encode_request
from tests.bench.bench_store import RawClient, ServerProcess, sequential

P99_BOUND_MS = 20.0
RSS_GROWTH_BOUND_MB = 32.0
GET = encode_request([b"GET", b"bench-key"])


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _connect(port: int, client_id: str, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    sock.sendall(mp.encode(mp.Connect(client_id)))
    reader = mp.PacketReader()
    while not isinstance(reader.next_packet(), mp.Connack):
        reader.feed(sock.recv(4096))
    return sock


def _drain(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            if not sock.recv(1 << 16):
                return
        except TimeoutError:
            continue
        except OSError:
            return


# ---------------------------------------------------------------------------- abusers


class Abuse:
    """Starts in ``start()``, is under way when it returns, ends in ``stop()``."""

    name = ""
    description = ""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.sockets: list[socket.socket] = []
        self.outcome = ""

    def start(self) -> None: ...

    def spawn(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self.threads.append(thread)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(10)
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


class NoAbuse(Abuse):
    name = "none (anchor)"
    description = "no abuse"


class SlowSubscriber(Abuse):
    """The issue's case: a subscriber that reads nothing, 20,000 messages of 1 KiB."""

    def __init__(self, port: int, qos: int) -> None:
        super().__init__(port)
        self.qos = qos
        self.name = f"subscriber reads nothing, QoS {qos}"
        self.description = "20,000 x 1 KiB published to a subscriber that never reads"

    def start(self) -> None:
        sleeper = _connect(self.port, f"sleeper-{self.qos}", rcvbuf=4096)
        sleeper.sendall(mp.encode(mp.Subscribe(1, [mp.Subscription("flood", self.qos)])))
        self.sockets.append(sleeper)
        publisher = _connect(self.port, "publisher")
        self.sockets.append(publisher)
        payload = b"x" * 1024
        batch = b"".join(
            mp.encode(
                mp.Publish(
                    "flood", payload, self.qos, packet_id=(i % 65535) + 1 if self.qos else None
                )
            )
            for i in range(20_000)
        )
        started = threading.Event()

        def publish() -> None:
            started.set()
            with contextlib.suppress(OSError):
                publisher.sendall(batch)
            self._verdict(sleeper)

        self.spawn(lambda: _drain(publisher, self.stopping))
        self.spawn(publish)
        started.wait()

    def _verdict(self, sleeper: socket.socket) -> None:
        """Disconnected by the broker (QoS 1), or still connected, its messages dropped."""
        time.sleep(1.0)  # the broker has handled the flood by then
        sleeper.settimeout(3)
        received = 0
        try:
            while chunk := sleeper.recv(1 << 16):
                received += len(chunk)
            self.outcome = f"disconnected (0x97) after {received // 1024} KiB reached it"
        except TimeoutError:
            self.outcome = (
                f"still connected; {received // 1024} KiB reached it, the rest was dropped"
            )
        except OSError as error:
            self.outcome = f"disconnected ({error})"


class RequestFlood(Abuse):
    name = "request flood"
    description = "4 clients pipelining store SETs as fast as they can (reading answers)"

    def start(self) -> None:
        for index in range(4):
            sock = _connect(self.port, f"flooder-{index}")
            self.sockets.append(sock)
            response_topic = topics.response_topic(f"flooder-{index}")
            sock.sendall(mp.encode(mp.Subscribe(1, [mp.Subscription(response_topic, 1)])))
            request = mp.encode(
                mp.Publish(
                    topics.INVOKE_TOPIC,
                    encode_request([b"SET", f"flood-{index}".encode(), b"v" * 32]),
                    1,
                    packet_id=7,
                    properties=mp.Properties(
                        response_topic=response_topic,
                        correlation_data=b"c" * 16,
                        user_properties=[(topics.TIMESTAMP, "001700000000000:00000:f")],
                    ),
                )
            )
            batch = request * 500

            def flood(sock: socket.socket = sock, batch: bytes = batch) -> None:
                with contextlib.suppress(OSError):
                    while not self.stopping.is_set():
                        sock.sendall(batch)

            self.spawn(lambda sock=sock: _drain(sock, self.stopping))  # type: ignore[misc]
            self.spawn(flood)
        time.sleep(0.5)  # under way
        self.outcome = "served in turns"


class ConnectionFlood(Abuse):
    name = "connection flood"
    description = "3,000 sockets opened as fast as possible and held"

    def start(self) -> None:
        refused = 0
        for _ in range(3000):
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                refused += 1
                continue
            self.sockets.append(sock)
        time.sleep(0.2)
        closed = 0
        for sock in self.sockets:
            sock.setblocking(False)
            try:
                if sock.recv(1) == b"":
                    closed += 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        self.outcome = f"{closed + refused} of 3000 closed at once (rate and count limits)"


class NeverConnect(Abuse):
    name = "never finish CONNECT"
    description = "300 sockets sending half a CONNECT, one every 5 ms"

    def start(self) -> None:
        half = mp.encode(mp.Connect("slow"))[:6]
        for _ in range(300):
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            with contextlib.suppress(OSError):
                sock.sendall(half)
            self.sockets.append(sock)
            time.sleep(0.005)
        self.outcome = "closed after the connect timeout (10 s)"


class Malformed(Abuse):
    name = "malformed packets"
    description = "clients connecting and sending garbage, in a loop"

    def start(self) -> None:
        count = [0]

        def loop() -> None:
            garbage = b"\x30\xff\xff\xff\xff\x01" + os.urandom(64)
            while not self.stopping.is_set():
                try:
                    sock = _connect(self.port, f"bad-{count[0]}")
                    sock.sendall(garbage)
                    sock.settimeout(2)
                    reader = mp.PacketReader()
                    while (packet := reader.next_packet()) is None:
                        data = sock.recv(4096)
                        if not data:
                            break
                        reader.feed(data)
                    assert packet is None or isinstance(packet, mp.Disconnect)
                    sock.close()
                    count[0] += 1
                    time.sleep(0.01)  # stays under the connection rate
                except OSError:
                    time.sleep(0.05)

        self.spawn(loop)
        time.sleep(0.3)
        self.outcome = "each answered DISCONNECT 0x81 and closed"


class Oversized(Abuse):
    name = "oversized packets"
    description = "PUBLISH headers announcing 200 MB, then 1 MB of body, in a loop"

    def start(self) -> None:
        def loop() -> None:
            header = b"\x30" + mp.encode_varint(200_000_000)
            body = b"x" * (1 << 20)
            while not self.stopping.is_set():
                try:
                    sock = _connect(self.port, "big")
                    sock.sendall(header)
                    with contextlib.suppress(OSError):
                        sock.sendall(body)
                    sock.close()
                    time.sleep(0.01)
                except OSError:
                    time.sleep(0.05)

        self.spawn(loop)
        time.sleep(0.3)
        self.outcome = "closed with DISCONNECT 0x95 at the header"


# ---------------------------------------------------------------------------- measuring


@dataclass
class Result:
    case: str
    description: str
    p50_ms: float
    p99_ms: float
    rss_before_mb: float
    rss_after_mb: float
    outcome: str


async def _latencies(host: str, port: int, count: int) -> list[float]:
    client = RawClient(host, port, f"well-behaved-{os.getpid()}")
    await client.connect()
    try:
        return await sequential(lambda: client.request(topics.INVOKE_TOPIC, GET), count)
    finally:
        await client.close()


def _abuse_process(name: str, port: int, ready: Any, stop: Any, out: Any) -> None:
    """Runs one abuse in a process of its own until ``stop`` is set."""
    abuse = CASES[name](port)
    try:
        abuse.start()
        ready.set()
        stop.wait(120)
    finally:
        abuse.stop()
        out.put((abuse.name, abuse.description, abuse.outcome))


def run_case(name: str, requests: int) -> Result:
    server = ServerProcess(["--serve"])
    context = multiprocessing.get_context("fork")
    try:
        host, port = server.ready_url()
        asyncio.run(_latencies(host, port, 200))  # warm up
        before = rss_mb(server.proc.pid)
        ready, stop, out = context.Event(), context.Event(), context.Queue()
        # The abusers get a process of their own: their threads must not slow the
        # well-behaved client down here, only the broker.
        abuser = context.Process(target=_abuse_process, args=(name, port, ready, stop, out))
        abuser.start()
        try:
            if not ready.wait(60):
                raise RuntimeError(f"{name}: the abuse did not start")
            times = asyncio.run(_latencies(host, port, requests))
            after = rss_mb(server.proc.pid)
        finally:
            stop.set()
            case, description, outcome = out.get(timeout=60)
            abuser.join(30)
        after = max(after, rss_mb(server.proc.pid))
        return Result(
            case,
            description,
            statistics.median(times) * 1e3,
            statistics.quantiles(times, n=100)[98] * 1e3,
            before,
            after,
            outcome,
        )
    finally:
        server.stop()


CASES: dict[str, Callable[[int], Abuse]] = {
    "anchor": NoAbuse,
    "slow0": lambda port: SlowSubscriber(port, 0),
    "slow1": lambda port: SlowSubscriber(port, 1),
    "requests": RequestFlood,
    "connections": ConnectionFlood,
    "connect": NeverConnect,
    "malformed": Malformed,
    "oversized": Oversized,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="well-behaved GETs a case")
    parser.add_argument("--only", nargs="*", choices=list(CASES), help="cases to run")
    arguments = parser.parse_args(argv)
    names = [
        "anchor",
        *[n for n in CASES if n != "anchor" and (not arguments.only or n in arguments.only)],
    ]
    results = [run_case(name, arguments.requests) for name in names]
    print(f"{'case':<36} {'p50 ms':>7} {'p99 ms':>7} {'RSS before':>10} {'RSS after':>9}  outcome")
    ok = True
    for result in results:
        print(
            f"{result.case:<36} {result.p50_ms:>7.2f} {result.p99_ms:>7.2f} "
            f"{result.rss_before_mb:>8.1f}MB {result.rss_after_mb:>7.1f}MB  {result.outcome}"
        )
        grew = result.rss_after_mb - result.rss_before_mb
        if result.p99_ms > P99_BOUND_MS or grew > RSS_GROWTH_BOUND_MB:
            ok = False
            print(f"    MISS: p99 bound {P99_BOUND_MS} ms, RSS growth {grew:.1f} MB")
    print(
        f"\nwell-behaved client: {arguments.requests} sequential GETs per case; "
        f"bounds: p99 <= {P99_BOUND_MS} ms, RSS growth <= {RSS_GROWTH_BOUND_MB} MB."
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
