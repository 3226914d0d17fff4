"""Figures: state store requests beside an MQTT echo through the same broker.

    python -m tests.bench.bench_store [--seq N] [--pipe N] [--window W] [--rounds R]
                                      [--no-mosquitto]

The bound is an echo: a request published exactly like a store request (QoS 1, response
topic, 16 bytes of correlation data, the protocol's user properties) that the server
answers exactly as the store service answers, minus the store. Whatever a store request
costs beyond the echo is the store's own share.

- Embedded: the server is a separate process (`--serve`, below) running our embedded
  broker with the state store and, on the same broker, an intercept of `bench/echo` that
  answers like the service does.
- Mosquitto (unless --no-mosquitto): mosquitto, `agent emulator --external URL` as the
  store, and a small gmqtt client (`--serve-echo URL`) as the echo, each its own process.

The client is a lean raw gmqtt client (not our StateStoreClient, see bench_client.py),
the same code for echo and store requests. Figures per operation: sequential latency
(one request after another) and pipelined throughput (a window of requests in flight).
Rounds interleave echo, GET and SET so that drift in the machine's load hits all alike;
latencies are pooled over the rounds, req/s is the median round, and the ratio to the
echo is the median of the per-round ratios. Loopback only; every process is stopped at
the end.

Also timed: `agent emulator --port 0` from process start to its ready line.

Durability (`--data-dir`, unless --no-durability; --durability-only for it alone): SET p50
and p99 one after another and req/s with a window in flight, for each `--fsync` mode
(always, everysec, no) on a tmpfs and on the machine's disk, beside the store in memory. A
SET is answered once its record is kept (fsynced, or written to the file), so this is what
durability costs a writer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gmqtt  # type: ignore[import-untyped]
from gmqtt.mqtt.constants import MQTTv50  # type: ignore[import-untyped]

from agent.emulator.broker import Message
from agent.emulator.external import parse_mqtt_url
from agent.protocol import topics
from agent.protocol.hlc import Hlc
from agent.protocol.resp3 import encode_request
from tests.support.mosquitto import Mosquitto, mosquitto_binary
from tests.support.processes import READY_URL, AgentProcess

ECHO_TOPIC = "bench/echo"
KEY = b"bench-key"
VALUE = b"v" * 32
GET_PAYLOAD = encode_request([b"GET", KEY])
SET_PAYLOAD = encode_request([b"SET", KEY, VALUE])
# The echo carries a store request's bytes, so both directions move the same sizes.
ECHO_PAYLOAD = GET_PAYLOAD
REQUEST_EXPIRY_S = 10  # what StateStoreClient sends with its default 10 s timeout
STEP_TIMEOUT_S = 30.0  # a stuck measurement fails instead of hanging
ROOT = Path(__file__).resolve().parents[2]

TARGET_THROUGHPUT_RATIO = 0.8
TARGET_P50_EXTRA_MS = 0.2
TARGET_STARTUP_S = 1.0


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------------------- servers


def echo_response(request: Message) -> Message | None:
    """The answer to an echo request, built as StoreService builds a response."""
    if request.response_topic is None or request.correlation_data is None:
        return None
    if topics.is_forbidden_response_topic(request.response_topic) or request.qos != 1:
        return None
    return Message(
        topic=request.response_topic,
        payload=request.payload,
        qos=1,
        correlation_data=request.correlation_data,
        content_type=topics.CONTENT_TYPE,
        user_properties=[
            (topics.STATUS, "200"),
            (topics.PROTOCOL_VERSION_PROPERTY, topics.PROTOCOL_VERSION),
            (topics.TIMESTAMP, str(Hlc(wall_clock_ms(), 0, "echo"))),
        ],
    )


async def _until_terminated() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve(host: str, port: int, data_dir: Path | None = None, fsync: str = "always") -> None:
    """The embedded emulator plus an echo on the same broker, until SIGTERM."""
    from agent.emulator.embedded import EmbeddedStateStore
    from agent.emulator.persistence import FsyncPolicy

    emulator = EmbeddedStateStore(host, port, data_dir=data_dir, fsync=FsyncPolicy(fsync))
    broker = emulator.broker

    def echo(sender: str, request: Message) -> None:
        response = echo_response(request)
        if response is not None:
            broker.publish(response)

    broker.intercept(ECHO_TOPIC, echo)
    await emulator.start()
    print(f"state store and echo ready at {emulator.url}", flush=True)
    try:
        await _until_terminated()
    finally:
        await emulator.stop()


async def serve_echo(url: str) -> None:
    """An echo as a gmqtt client of an external broker, until SIGTERM."""
    host, port = parse_mqtt_url(url)
    client = gmqtt.Client(f"bench-echo-{os.getpid()}")
    subscribed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_message(_client: Any, topic: str, payload: bytes, qos: int, props: Any) -> int:
        response = echo_response(_message_from_gmqtt(topic, payload, qos, props))
        if response is not None:
            client.publish(
                gmqtt.Message(
                    response.topic,
                    response.payload,
                    qos=1,
                    correlation_data=response.correlation_data,
                    content_type=response.content_type,
                    user_property=response.user_properties,
                )
            )
        return 0

    def on_subscribe(*_: Any) -> None:
        if not subscribed.done():
            subscribed.set_result(None)

    client.on_message = on_message
    client.on_subscribe = on_subscribe
    await client.connect(host, port, version=MQTTv50, keepalive=60)
    client.subscribe(ECHO_TOPIC, qos=1)
    await subscribed
    print(f"echo ready at {url}", flush=True)
    try:
        await _until_terminated()
    finally:
        await client.disconnect()


def _message_from_gmqtt(topic: str, payload: bytes, qos: int, props: dict[str, Any]) -> Message:
    def first(name: str) -> Any:
        values = props.get(name)
        return values[0] if values else None

    return Message(
        topic=topic,
        payload=payload,
        qos=qos,
        response_topic=first("response_topic"),
        correlation_data=first("correlation_data"),
        user_properties=list(props.get("user_property", [])),
    )


class ServerProcess:
    """`python -m tests.bench.bench_store ARGS`: one of the servers above, in its own process."""

    def __init__(self, args: Sequence[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.bench_store", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def ready_url(self, timeout: float = 15.0) -> tuple[str, int]:
        """Reads stdout up to the ready line; returns its host and port."""
        stdout = self.proc.stdout
        assert stdout is not None
        deadline = time.monotonic() + timeout
        lines: list[str] = []
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    raise TimeoutError(f"{self.proc.args!r}: no ready line; stdout={lines}")
                line = stdout.readline().decode(errors="replace")
                if not line:
                    self.proc.wait(5)
                    error = (
                        self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                    )
                    raise RuntimeError(f"{self.proc.args!r} exited: {error[-2000:]}")
                lines.append(line)
                match = READY_URL.search(line)
                if match:
                    return match.group(1), int(match.group(2))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


# ---------------------------------------------------------------------------- raw client


class RawClient:
    """A lean request/response client straight on gmqtt: one code path for every topic.

    Each request: QoS 1, the response topic, 16 random bytes of correlation data, content
    type, message expiry and the user properties `__ts`, `__srcId`, `__protVer`, as
    StateStoreClient sends them. At most `receive maximum - 1` requests are in flight
    (gmqtt's packet id pool); the rest wait for room.
    """

    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.response_topic = topics.response_topic(client_id)
        self._client = gmqtt.Client(client_id)
        self._client.on_message = self._on_message
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = self._on_subscribe
        self._pending: dict[bytes, asyncio.Future[bytes]] = {}
        self._subscribed: asyncio.Future[None] | None = None
        self._receive_maximum = 65_535
        self._window = asyncio.Semaphore(1)
        self.window_size = 1

    async def connect(self) -> None:
        await self._client.connect(self.host, self.port, version=MQTTv50, keepalive=60)
        self.window_size = max(1, self._receive_maximum - 1)
        self._window = asyncio.Semaphore(self.window_size)
        self._subscribed = asyncio.get_running_loop().create_future()
        self._client.subscribe(self.response_topic, qos=1)
        await self._subscribed

    async def close(self) -> None:
        await self._client.disconnect()

    async def request(self, topic: str, payload: bytes) -> bytes:
        async with self._window:
            correlation = os.urandom(16)
            future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            self._pending[correlation] = future
            try:
                self._client.publish(
                    gmqtt.Message(
                        topic,
                        payload,
                        qos=1,
                        response_topic=self.response_topic,
                        correlation_data=correlation,
                        content_type=topics.CONTENT_TYPE,
                        message_expiry_interval=REQUEST_EXPIRY_S,
                        user_property=[
                            (topics.TIMESTAMP, f"{wall_clock_ms():015d}:00000:{self.client_id}"),
                            (topics.SOURCE_ID, self.client_id),
                            (topics.PROTOCOL_VERSION_PROPERTY, topics.PROTOCOL_VERSION),
                        ],
                    )
                )
                return await future
            finally:
                del self._pending[correlation]

    def _on_connect(self, _client: Any, _flags: int, _rc: int, props: Any) -> None:
        values = props.get("receive_maximum") if isinstance(props, dict) else None
        if values:
            self._receive_maximum = int(values[0])

    def _on_subscribe(self, *_: Any) -> None:
        if self._subscribed is not None and not self._subscribed.done():
            self._subscribed.set_result(None)

    def _on_message(self, _client: Any, topic: str, payload: bytes, qos: int, props: Any) -> int:
        values = props.get("correlation_data")
        future = self._pending.get(bytes(values[0])) if values else None
        if future is not None and not future.done():
            future.set_result(payload)
        return 0


# ---------------------------------------------------------------------------- measuring

Request = Callable[[], Awaitable[object]]


async def sequential(request: Request, count: int) -> list[float]:
    """Latency of each of `count` requests sent one after another."""
    times: list[float] = []
    async with asyncio.timeout(STEP_TIMEOUT_S):
        for _ in range(count):
            started = time.perf_counter()
            await request()
            times.append(time.perf_counter() - started)
    return times


async def concurrent(request: Request, count: int, tasks: int) -> tuple[float, list[float]]:
    """`tasks` tasks share `count` requests; returns the wall time and each latency."""
    times: list[float] = []

    async def worker(share: int) -> None:
        for _ in range(share):
            started = time.perf_counter()
            await request()
            times.append(time.perf_counter() - started)

    shares = [count // tasks + (1 if index < count % tasks else 0) for index in range(tasks)]
    started = time.perf_counter()
    async with asyncio.timeout(STEP_TIMEOUT_S):
        await asyncio.gather(*(worker(share) for share in shares))
    return time.perf_counter() - started, times


def p50_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def p99_ms(times: list[float]) -> float:
    return statistics.quantiles(times, n=100)[98] * 1e3 if len(times) > 1 else times[0] * 1e3


@dataclass
class Figure:
    """One request kind: latencies pooled over the rounds, requests/s of each round."""

    seq_times: list[float] = field(default_factory=list)
    seq_rates: list[float] = field(default_factory=list)
    pipe_times: list[float] = field(default_factory=list)
    pipe_rates: list[float] = field(default_factory=list)


def rate_ratio(rates: list[float], bound_rates: list[float]) -> float:
    """Median of the per-round ratios: each pair was measured back to back."""
    return statistics.median(a / b for a, b in zip(rates, bound_rates, strict=True))


async def interleaved(
    requests: dict[str, Request], *, seq: int, pipe: int, tasks: int, rounds: int
) -> dict[str, Figure]:
    """Every kind of request, round after round, each step right after the other kinds.

    The machine's load drifts (other processes share it); measuring the kinds back to back,
    in alternating order, lets the drift hit them alike, and the ratios are taken per round.
    """
    figures = {name: Figure() for name in requests}
    names = list(requests)
    for index in range(rounds):
        order = names if index % 2 == 0 else names[::-1]
        for name in order:
            started = time.perf_counter()
            figures[name].seq_times += await sequential(requests[name], seq)
            figures[name].seq_rates.append(seq / (time.perf_counter() - started))
        for name in order:
            elapsed, times = await concurrent(requests[name], pipe, tasks)
            figures[name].pipe_times += times
            figures[name].pipe_rates.append(pipe / elapsed)
    return figures


async def check_replies(client: RawClient, echo: bool) -> None:
    """The requests do what they claim before anything is timed."""
    if echo:
        assert await client.request(ECHO_TOPIC, ECHO_PAYLOAD) == ECHO_PAYLOAD, "echo is broken"
    assert await client.request(topics.INVOKE_TOPIC, SET_PAYLOAD) == b"+OK\r\n", "SET failed"
    expected = b"$%d\r\n%s\r\n" % (len(VALUE), VALUE)
    assert await client.request(topics.INVOKE_TOPIC, GET_PAYLOAD) == expected, "GET failed"


async def measure(
    host: str, port: int, *, seq: int, pipe: int, window: int, rounds: int, warmup: int
) -> dict[str, Figure]:
    client = RawClient(host, port, f"bench-raw-{os.getpid()}")
    await client.connect()
    if window > client.window_size:
        raise SystemExit(f"--window {window} exceeds the broker's window {client.window_size}")
    try:
        await check_replies(client, echo=True)
        requests: dict[str, Request] = {
            "echo": lambda: client.request(ECHO_TOPIC, ECHO_PAYLOAD),
            "GET": lambda: client.request(topics.INVOKE_TOPIC, GET_PAYLOAD),
            "SET": lambda: client.request(topics.INVOKE_TOPIC, SET_PAYLOAD),
        }
        for request in requests.values():
            await concurrent(request, warmup, window)
        return await interleaved(requests, seq=seq, pipe=pipe, tasks=window, rounds=rounds)
    finally:
        await client.close()


# ---------------------------------------------------------------------------- reporting


@dataclass
class Verdict:
    what: str
    value: str
    target: str
    ok: bool


def print_table(title: str, figures: dict[str, Figure], window: int) -> None:
    echo = figures["echo"]
    echo_p50 = p50_ms(echo.seq_times)
    print(f"\n{title}")
    header = (
        f"{'op':<4}  {'seq n':>6}  {'p50 ms':>7}  {'p99 ms':>7}  {'echo p50':>8}  {'+p50 ms':>7}  "
        f"{'pipe n':>6}  {'window':>6}  {'req/s':>7}  {'echo req/s':>10}  {'/echo':>5}"
    )
    print(header)
    print("-" * len(header))
    echo_rate = statistics.median(echo.pipe_rates)
    for name, f in figures.items():
        p50 = p50_ms(f.seq_times)
        print(
            f"{name:<4}  {len(f.seq_times):>6}  {p50:>7.3f}  {p99_ms(f.seq_times):>7.3f}  "
            f"{echo_p50:>8.3f}  {p50 - echo_p50:>+7.3f}  {len(f.pipe_times):>6}  {window:>6}  "
            f"{statistics.median(f.pipe_rates):>7.0f}  {echo_rate:>10.0f}  "
            f"{rate_ratio(f.pipe_rates, echo.pipe_rates):>5.2f}"
        )


def verdicts(label: str, figures: dict[str, Figure]) -> list[Verdict]:
    echo = figures["echo"]
    found = []
    for name in ("GET", "SET"):
        f = figures[name]
        ratio = rate_ratio(f.pipe_rates, echo.pipe_rates)
        extra = p50_ms(f.seq_times) - p50_ms(echo.seq_times)
        found.append(
            Verdict(
                f"{label} {name} req/s / echo req/s",
                f"{ratio:.2f}",
                f">= {TARGET_THROUGHPUT_RATIO}",
                ratio >= TARGET_THROUGHPUT_RATIO,
            )
        )
        found.append(
            Verdict(
                f"{label} {name} p50 - echo p50",
                f"{extra:+.3f} ms",
                f"<= {TARGET_P50_EXTRA_MS} ms",
                extra <= TARGET_P50_EXTRA_MS,
            )
        )
    return found


def print_verdicts(found: list[Verdict]) -> None:
    print()
    width = max(len(v.what) for v in found)
    for v in found:
        mark = "ok" if v.ok else "MISS"
        print(f"{v.what:<{width}}  {v.value:>10}  target {v.target:<10}  {mark}")


# ---------------------------------------------------------------------------- runs


def startup_times(starts: int) -> list[float]:
    """`agent emulator --port 0`: seconds from process start to its ready line."""
    times = []
    for _ in range(starts):
        started = time.perf_counter()
        process = AgentProcess(["emulator", "--port", "0", "--log-level", "WARNING"])
        try:
            process.wait_for(READY_URL, timeout=15)
            times.append(time.perf_counter() - started)
        finally:
            process.stop()
    return times


def run_embedded(arguments: argparse.Namespace) -> dict[str, Figure]:
    server = ServerProcess(["--serve"])
    try:
        host, port = server.ready_url()
        return asyncio.run(measure(host, port, **_sizes(arguments)))
    finally:
        server.stop()


def run_mosquitto(arguments: argparse.Namespace) -> dict[str, Figure]:
    broker = Mosquitto()  # its config turns Nagle's algorithm off (set_tcp_nodelay)
    broker.start()
    service = AgentProcess(["emulator", "--external", broker.url, "--log-level", "WARNING"])
    echo = ServerProcess(["--serve-echo", broker.url])
    try:
        service.wait_for(READY_URL, timeout=15)
        echo.ready_url()
        return asyncio.run(measure(broker.host, broker.port, **_sizes(arguments)))
    finally:
        echo.stop()
        service.stop()
        broker.stop()


def _sizes(arguments: argparse.Namespace) -> dict[str, int]:
    return {
        "seq": arguments.seq,
        "pipe": arguments.pipe,
        "window": arguments.window,
        "rounds": arguments.rounds,
        "warmup": arguments.warmup,
    }


MODES = ("always", "everysec", "no")


async def measure_sets(
    servers: dict[str, tuple[str, int]],
    *,
    seq: int,
    pipe: int,
    window: int,
    rounds: int,
    warmup: int,
) -> dict[str, Figure]:
    """SETs alone on each server: sequential latency and pipelined req/s, the servers
    interleaved round after round (in alternating order) so that the load's drift hits
    them alike."""
    clients = {
        name: RawClient(host, port, f"bench-set-{name}") for name, (host, port) in servers.items()
    }
    for client in clients.values():
        await client.connect()
    try:
        requests: dict[str, Request] = {}
        for name, client in clients.items():
            await check_replies(client, echo=False)
            requests[name] = functools.partial(client.request, topics.INVOKE_TOPIC, SET_PAYLOAD)
            await concurrent(requests[name], warmup, window)
        figures = {name: Figure() for name in servers}
        names = list(servers)
        for index in range(rounds):
            for name in names if index % 2 == 0 else names[::-1]:
                started = time.perf_counter()
                figures[name].seq_times += await sequential(requests[name], seq)
                figures[name].seq_rates.append(seq / (time.perf_counter() - started))
                elapsed, times = await concurrent(requests[name], pipe, window)
                figures[name].pipe_times += times
                figures[name].pipe_rates.append(pipe / elapsed)
        return figures
    finally:
        for client in clients.values():
            await client.close()


def run_durability(arguments: argparse.Namespace) -> dict[str, Figure]:
    """SET figures of the store in memory and of each medium and --fsync mode, by
    "medium mode"."""
    runs: dict[str, list[str]] = {"memory -": []}
    with contextlib.ExitStack() as stack:
        for medium, parent in (("tmpfs", arguments.tmpfs_dir), ("disk", arguments.disk_dir)):
            for mode in MODES:
                directory = stack.enter_context(tempfile.TemporaryDirectory(dir=parent))
                runs[f"{medium} {mode}"] = ["--data-dir", directory, "--fsync", mode]
        servers = {}
        for name, args in runs.items():
            server = ServerProcess(["--serve", *args])
            stack.callback(server.stop)
            servers[name] = server.ready_url()
        return asyncio.run(measure_sets(servers, **_sizes(arguments)))


def print_durability(found: dict[str, Figure], window: int) -> None:
    print("\nSET with --data-dir, embedded broker + store (separate process), raw gmqtt client")
    header = (
        f"{'medium':<7} {'--fsync':<9} {'seq n':>6}  {'p50 ms':>7}  {'p99 ms':>7}  "
        f"{'window':>6}  {'req/s':>7}"
    )
    print(header)
    print("-" * len(header))
    for name, figure in found.items():
        medium, mode = name.split()
        print(
            f"{medium:<7} {mode:<9} {len(figure.seq_times):>6}  {p50_ms(figure.seq_times):>7.3f}  "
            f"{p99_ms(figure.seq_times):>7.3f}  {window:>6}  "
            f"{statistics.median(figure.pipe_rates):>7.0f}"
        )


def main(arguments: argparse.Namespace) -> int:
    logging.getLogger("gmqtt").setLevel(logging.WARNING)
    started = time.perf_counter()
    found: list[Verdict] = []
    if arguments.durability_only:
        print_durability(run_durability(arguments), arguments.window)
        print(f"\nRun time {time.perf_counter() - started:.1f} s.")
        return 0

    starts = startup_times(arguments.starts)
    startup = statistics.median(starts)
    print(
        f"`agent emulator --port 0` start to ready line: median {startup * 1e3:.0f} ms "
        f"of {len(starts)} (min {min(starts) * 1e3:.0f}, max {max(starts) * 1e3:.0f})"
    )
    found.append(
        Verdict(
            "emulator start", f"{startup * 1e3:.0f} ms", "< 1000 ms", startup < TARGET_STARTUP_S
        )
    )

    embedded = run_embedded(arguments)
    print_table(
        "embedded broker + store (separate process), raw gmqtt client",
        embedded,
        arguments.window,
    )
    found += verdicts("embedded", embedded)

    if not arguments.no_mosquitto:
        if mosquitto_binary() is None:
            print("\nmosquitto is not installed: no second table")
        else:
            external = run_mosquitto(arguments)
            print_table(
                "mosquitto + `agent emulator --external` (echo: a gmqtt client), raw gmqtt client",
                external,
                arguments.window,
            )
            found += verdicts("mosquitto", external)

    if not arguments.no_durability:
        print_durability(run_durability(arguments), arguments.window)

    print_verdicts(found)
    print(
        f"\nseq: requests one after another, latency pooled over {arguments.rounds} rounds; "
        f"+p50 = p50 - echo p50.\npipe: {arguments.window} in flight; req/s = median of the "
        f"rounds; /echo = median of the per-round ratios req/s / echo req/s.\n"
        f"Run time {time.perf_counter() - started:.1f} s."
    )
    return 0 if all(v.ok for v in found) else 1


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=300, help="sequential requests per round")
    parser.add_argument("--pipe", type=int, default=2000, help="pipelined requests per round")
    parser.add_argument("--window", type=int, default=16, help="pipelined requests in flight")
    parser.add_argument("--rounds", type=int, default=10, help="rounds")
    parser.add_argument("--warmup", type=int, default=1000, help="requests before timing")
    parser.add_argument("--starts", type=int, default=5, help="emulator starts to time")
    parser.add_argument("--no-mosquitto", action="store_true", help="embedded broker only")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-echo", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--fsync", default="always", help=argparse.SUPPRESS)
    parser.add_argument("--no-durability", action="store_true", help="no --data-dir table")
    parser.add_argument("--durability-only", action="store_true", help="only the --data-dir table")
    parser.add_argument(
        "--disk-dir",
        type=Path,
        default=Path("/var/tmp"),
        help="a directory on the machine's disk for the --data-dir table (default /var/tmp)",
    )
    parser.add_argument(
        "--tmpfs-dir",
        type=Path,
        default=Path("/dev/shm"),
        help="a directory on a tmpfs for the --data-dir table (default /dev/shm)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_arguments()
    if args.serve:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve("127.0.0.1", args.port, args.data_dir, args.fsync))
    elif args.serve_echo:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_echo(args.serve_echo))
    else:
        raise SystemExit(main(args))
