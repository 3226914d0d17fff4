"""Figures: `agent emulator` under hostile clients and failing disks, before and now.

    python -m tests.bench.bench_emulator_hostile [--before DIR] [--only CASE ...]
                                                 [--fuzz-seconds S]

Each case starts the emulator as a process of its own (`python -m agent emulator`), does
to it what a hostile client, a failing disk or a mistaken command line does, and prints
what it measured beside its bound. With ``--before DIR`` (a checkout of another commit,
e.g. ``git archive <commit> | tar -x -C DIR``) every case runs against that checkout's
emulator too, measured the same way, and its figure is printed beside the new one. The
clients are this checkout's (raw sockets, paho, `agent store`).

Cases: a K8S-SAT token beside a user name; a response topic outside the requester's
grants; wills with invalid response topics; big CONNECTs before authentication;
registrations under a quota; one big SET to watchers that read nothing; a full disk; a
damaged log (a bit flipped, random bytes, a FIFO); a huge PX; SIGKILLs during writes;
command-line mistakes (a port in use, an external broker that does not answer or is not
there, a data directory in use); plain MQTT on a TLS port; and a packet fuzz of the live
broker with a store client timed meanwhile.

Memory is the emulator's resident set (VmRSS): its peak while the abuse goes on, less what
it was just before. The full-disk case puts the data directory on a 2 MiB tmpfs when it
may mount one (root), else it caps the emulator's file size (RLIMIT_FSIZE) to the same
effect; the line says which.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.emulator import mqtt_packets as mp
from agent.protocol import topics
from agent.protocol.resp3 import encode_request
from tests.support.paho_client import PahoStoreClient, now_ts

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
OK = b"+OK\r\n"


# ---------------------------------------------------------------------------- the emulator


class Emulator:
    """`python -m agent emulator --port 0 ARGS` from the checkout ``src``."""

    def __init__(self, src: Path, *args: str, ready: bool = True, **popen: Any) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "emulator", "--port", "0", *args],
            cwd=src,
            env={**os.environ, "PYTHONPATH": str(src), "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            **popen,
        )
        self.port = self._ready() if ready else 0

    def _ready(self, timeout: float = 15.0) -> int:
        """The port from the ready line; 0 if the process ended first."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            if not select.select([self.proc.stdout], [], [], remaining)[0]:
                break
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait(5)
                return 0
            if "ready at" in line:
                return int(line.rsplit(":", 1)[1])
        raise TimeoutError("no ready line")

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def client(self, client_id: str, **options: Any) -> PahoStoreClient:
        return PahoStoreClient("127.0.0.1", self.port, client_id, **options)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def logged(self) -> str:
        self.log.seek(0)
        return self.log.read()


class PeakRss:
    """Samples an emulator's RSS on a thread; ``growth`` is the peak less the start."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.start = emulator.rss_mb()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            with contextlib.suppress(OSError, RuntimeError):
                self.peak = max(self.peak, self.emulator.rss_mb())

    def growth(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak - self.start


def raw_connect(port: int, client_id: str, **connect: Any) -> tuple[socket.socket, mp.Connack]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(mp.encode(mp.Connect(client_id, **connect)))
    return sock, _expect(sock, mp.PacketReader(), mp.Connack)


def _expect(sock: socket.socket, reader: mp.PacketReader, kind: type[Any]) -> Any:
    while (packet := reader.next_packet()) is None:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        reader.feed(data)
    assert isinstance(packet, kind), packet
    return packet


def store_request(response_topic: str, *args: bytes, packet_id: int = 1) -> mp.Publish:
    return mp.Publish(
        topics.INVOKE_TOPIC,
        encode_request(list(args)),
        1,
        packet_id=packet_id,
        properties=mp.Properties(
            response_topic=response_topic,
            correlation_data=os.urandom(16),
            user_properties=[(topics.TIMESTAMP, now_ts())],
        ),
    )


@contextlib.contextmanager
def running(src: Path, *args: str) -> Iterator[Emulator]:
    emulator = Emulator(src, *args)
    try:
        yield emulator
    finally:
        emulator.stop()


def _answer(payload: bytes) -> str:
    text = payload.decode(errors="replace").strip().replace("\r\n", " ")
    return text if len(text) < 40 else text[:37] + "..."


# ---------------------------------------------------------------------------- the cases

Row = tuple[str, str, str]  # figure, measured, bound or what should hold
Case = Callable[[Path, Path], list[Row]]


def case_sat_name(src: Path, tmp: Path) -> list[Row]:
    (tmp / "tokens").write_text("pod-token\n")
    (tmp / "users.json").write_text(json.dumps({"operator": "op-pass"}))
    rules = [
        {
            "principals": {"usernames": ["operator"]},
            "brokerResources": [
                {"method": "Connect"},
                {"method": "Subscribe", "topics": ["clients/{principal.clientId}/#"]},
            ],
            "stateStoreResources": [{"keyType": "Pattern", "keys": ["*"], "method": "ReadWrite"}],
        },
        {
            "principals": {"clientIds": ["pod"]},
            "brokerResources": [
                {"method": "Connect"},
                {"method": "Subscribe", "topics": ["clients/{principal.clientId}/#"]},
            ],
        },
    ]
    (tmp / "rules.json").write_text(json.dumps({"rules": rules}))
    flags = ["--users", str(tmp / "users.json"), "--sat-tokens", str(tmp / "tokens")]
    with running(src, *flags, "--authz", str(tmp / "rules.json")) as emulator:
        operator = emulator.client(
            "op", configure=lambda c: c.username_pw_set("operator", "op-pass")
        )
        operator.request("SET", "secret", "operator's")
        operator.close()
        sock, connack = raw_connect(
            emulator.port,
            "pod",
            username="operator",
            properties=mp.Properties(
                authentication_method="K8S-SAT", authentication_data=b"pod-token"
            ),
        )
        reader = mp.PacketReader()
        response = topics.response_topic("pod")
        sock.sendall(mp.encode(mp.Subscribe(1, [mp.Subscription(response, 1)])))
        _expect(sock, reader, mp.Suback)
        sock.sendall(mp.encode(store_request(response, b"GET", b"secret", packet_id=2)))
        packets = [_expect(sock, reader, object), _expect(sock, reader, object)]
        answer = next((p.payload for p in packets if isinstance(p, mp.Publish)), b"(none)")
        sock.close()
    return [
        (
            "K8S-SAT token + user name operator, no password: GET operator's key",
            f"CONNACK 0x{connack.reason_code:02x}, {_answer(answer)}",
            "-ERR not authorized",
        )
    ]


def case_response_topic(src: Path, tmp: Path) -> list[Row]:
    rules = [
        {
            "principals": {"clientIds": ["requester"]},
            "brokerResources": [{"method": "Connect"}],
            "stateStoreResources": [{"keyType": "Pattern", "keys": ["*"], "method": "ReadWrite"}],
        },
        {
            "principals": {"clientIds": ["health"]},
            "brokerResources": [
                {"method": "Connect"},
                {"method": "Subscribe", "topics": ["gateways/#"]},
            ],
        },
    ]
    (tmp / "rules.json").write_text(json.dumps({"rules": rules}))
    with running(src, "--authz", str(tmp / "rules.json")) as emulator:
        health, _ = raw_connect(emulator.port, "health")
        health_reader = mp.PacketReader()
        health.sendall(mp.encode(mp.Subscribe(1, [mp.Subscription("gateways/#", 1)])))
        _expect(health, health_reader, mp.Suback)
        sock, _ = raw_connect(emulator.port, "requester")
        sock.sendall(mp.encode(store_request("gateways/line1/health", b"GET", b"k")))
        puback = _expect(sock, mp.PacketReader(), mp.Puback)
        health.settimeout(1.0)
        try:
            published = isinstance(_expect(health, health_reader, mp.Publish), mp.Publish)
        except TimeoutError:
            published = False
        sock.close()
        health.close()
    return [
        (
            "request, response topic with no Publish grant: PUBACK, answer published there",
            f"0x{puback.reason_code:02x}, {'yes' if published else 'no'}",
            "0x87, no",
        )
    ]


def case_will(src: Path, tmp: Path) -> list[Row]:
    with running(src) as emulator:
        codes = []
        for response in ("a/#", "", "x/+/y"):
            will = mp.Will(
                topics.INVOKE_TOPIC,
                encode_request([b"GET", b"k"]),
                1,
                properties=mp.Properties(response_topic=response, correlation_data=b"c"),
            )
            sock, connack = raw_connect(emulator.port, "w", will=will)
            codes.append(f"0x{connack.reason_code:02x}")
            sock.close()  # dropped: an accepted will fires
        time.sleep(0.5)
        tracebacks = emulator.logged().count("Traceback")
    return [
        (
            "will to the store, response topic a/#, empty, x/+/y: CONNACK; tracebacks",
            f"{' '.join(codes)}; {tracebacks}",
            "0x82 0x82 0x82; 0",
        )
    ]


def case_connect_flood(src: Path, tmp: Path) -> list[Row]:
    """24 sockets, each announcing a 16 MiB CONNECT and sending 15 MiB of it."""
    with running(src) as emulator:
        peak = PeakRss(emulator)
        refused = [0]

        def one() -> None:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", emulator.port), timeout=10) as sock,
            ):
                sock.sendall(b"\x10" + mp.encode_varint(16 * MIB - 5))
                with contextlib.suppress(OSError):
                    sock.sendall(b"x" * (15 * MIB))
                sock.settimeout(2)
                with contextlib.suppress(OSError):
                    if sock.recv(8).startswith(b"\x20\x03\x00\x95"):
                        refused[0] += 1
                time.sleep(1.0)

        threads = [threading.Thread(target=one) for _ in range(24)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        grown = peak.growth()
    return [
        (
            "24 x 16 MiB CONNECTs announced, 15 MiB sent each: RSS growth",
            f"{grown:.0f} MiB ({refused[0]} refused with 0x95 at the header)",
            "<= 32 MiB",
        )
    ]


def case_registrations(src: Path, tmp: Path) -> list[Row]:
    rows: list[Row] = []
    with running(src) as emulator:
        client = emulator.client("many")
        pending = [client.send("KEYNOTIFY", f"key-{i}", acknowledged=False) for i in range(10_000)]
        accepted = sum(waiter.get(timeout=30).payload == OK for waiter in pending)
        client.close()
    rows.append(("10,000 KEYNOTIFY from one client, no --quota: accepted", str(accepted), "4096"))
    with running(src, "--quota", "1000") as emulator:
        client = emulator.client("many")
        accepted = 0
        pending = [client.send("KEYNOTIFY", f"key-{i}", acknowledged=False) for i in range(10_000)]
        for waiter in pending:
            accepted += waiter.get(timeout=30).payload == OK
        client.close()
    rows.append(
        ("10,000 KEYNOTIFY from one client, --quota 1000: accepted", str(accepted), "<= 1000")
    )
    with running(src, "--quota", "1") as emulator:
        peak = PeakRss(emulator)
        client = emulator.client("big-names")
        accepted = 0
        for index in range(40):
            name = bytes([65 + index % 26]) * (4 * MIB - 1) + bytes([48 + index // 26])
            accepted += client.request("KEYNOTIFY", name).payload == OK
        client.close()
        grown = peak.growth()
    rows.append(
        (
            "40 KEYNOTIFY on 4 MiB names, --quota 1: accepted, RSS growth",
            f"{accepted}, {grown:.0f} MiB",
            "<= 1, <= 32 MiB",
        )
    )
    return rows


def _silent_watcher(port: int, client_id: str, key: bytes) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    reader = mp.PacketReader()
    sock.sendall(mp.encode(mp.Connect(client_id)))
    _expect(sock, reader, mp.Connack)
    response = topics.response_topic(client_id)
    filters = [mp.Subscription(response, 1), mp.Subscription(topics.notify_filter(client_id), 1)]
    sock.sendall(mp.encode(mp.Subscribe(1, filters)))
    _expect(sock, reader, mp.Suback)
    sock.sendall(mp.encode(store_request(response, b"KEYNOTIFY", key, packet_id=2)))
    _expect(sock, reader, mp.Publish)
    return sock


def _fan_out_growth(src: Path, watchers: int) -> tuple[float, bytes]:
    with running(src) as emulator:
        silent = [_silent_watcher(emulator.port, f"watcher-{i}", b"big") for i in range(watchers)]
        writer = emulator.client("writer")
        peak = PeakRss(emulator)
        answer = writer.request("SET", "big", b"v" * (15 * MIB)).payload
        writer.request("GET", "other")
        time.sleep(1.0)
        grown = peak.growth()
        writer.close()
        for sock in silent:
            sock.close()
    return grown, answer


def case_fan_out(src: Path, tmp: Path) -> list[Row]:
    one, _ = _fan_out_growth(src, 1)
    twenty, answer = _fan_out_growth(src, 20)
    return [
        (
            "one 15 MiB SET, 1 / 20 watchers that read nothing: RSS growth",
            f"{one:.0f} / {twenty:.0f} MiB ({_answer(answer)})",
            "20 within 15 MiB of 1: one notification for all",
        )
    ]


def _disk(directory: Path) -> Callable[[int | None, Emulator | None], str]:
    """Fills a 2 MiB tmpfs at ``directory`` (or caps the emulator's file size): returns a
    function that fills the disk (a filler of N bytes; None frees it) and says how."""
    directory.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(directory)], capture_output=True
    )
    filler = directory / "filler"

    def fill(size: int | None, emulator: Emulator | None) -> str:
        if mounted.returncode == 0:
            if size is None:
                filler.unlink(missing_ok=True)
            else:
                filler.write_bytes(b"f" * size)
            return "2 MiB tmpfs"
        assert emulator is not None
        _, hard = resource.prlimit(emulator.proc.pid, resource.RLIMIT_FSIZE)
        limit = resource.RLIM_INFINITY if size is None else 2 * MIB - size
        resource.prlimit(emulator.proc.pid, resource.RLIMIT_FSIZE, (limit, hard))
        return "file size capped"

    return fill


def case_full_disk(src: Path, tmp: Path) -> list[Row]:
    disk = tmp / "disk"
    fill = _disk(disk)
    data = disk / "data"
    value = "v" * 1024  # few enough bytes in all that no compaction rewrites the log
    acknowledged: dict[str, list[str]] = {"filling": [], "freed": []}
    try:
        emulator = Emulator(src, "--data-dir", str(data))
        how = fill(2 * MIB - 128 * 1024, emulator)  # 128 KiB left
        client = emulator.client("writer")
        refused_for = 0.0
        for phase in ("filling", "freed"):
            if phase == "freed":
                fill(None, emulator)
                freed_at = time.monotonic()
            for index in range(200):
                key = f"{phase}-{index}"
                if client.request("SET", key, value).payload == OK:
                    acknowledged[phase].append(key)
                elif phase == "freed":
                    refused_for = time.monotonic() - freed_at
        client.close()
        emulator.stop()
        # What was kept on the disk, restarted where there is room.
        kept_dir = tmp / "kept"
        shutil.copytree(data, kept_dir, ignore=shutil.ignore_patterns("store.lock"))
        emulator = Emulator(src, "--data-dir", str(kept_dir))
        client = emulator.client("reader")
        kept = {
            phase: sum(client.request("GET", key).payload != b"$-1\r\n" for key in keys)
            for phase, keys in acknowledged.items()
        }
        client.close()
        emulator.stop()
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
    return [
        (
            f"SETs of 1 KiB, 200 while the disk fills ({how}): acknowledged, kept",
            f"{len(acknowledged['filling'])}, {kept['filling']}",
            "all acknowledged kept",
        ),
        (
            "then 200 once space is freed: acknowledged, kept; refused for",
            f"{len(acknowledged['freed'])}, {kept['freed']}; {refused_for * 1000:.0f} ms",
            "all acknowledged kept",
        ),
    ]


def _log_of_1000_keys(src: Path, data: Path) -> bytes:
    with running(src, "--data-dir", str(data)) as emulator:
        client = emulator.client("writer")
        waiters = [client.send("SET", f"key-{i:04}", f"value-{i}") for i in range(1000)]
        for waiter in waiters:
            waiter.get(timeout=30)
        client.close()
    return (data / "store.log").read_bytes()


def _start_on(src: Path, data: Path) -> str:
    """What starting on ``data`` does: the exit, or the keys it serves."""
    emulator = Emulator(src, "--data-dir", str(data), ready=False)
    try:
        port = emulator._ready(timeout=10)
    except TimeoutError:
        emulator.stop(signal.SIGKILL)
        return "hangs (no ready line in 10 s)"
    if not port:
        line = emulator.logged().strip().splitlines()[-1:]
        return f"exit {emulator.proc.returncode}: {line[0][:60] if line else ''}..."
    emulator.port = port
    client = emulator.client("reader")
    waiters = [client.send("GET", f"key-{i:04}") for i in range(1000)]
    kept = sum(w.get(timeout=30).payload != b"$-1\r\n" for w in waiters)
    client.close()
    emulator.stop()
    return f"started, {kept} of 1000 keys"


def case_damaged_log(src: Path, tmp: Path) -> list[Row]:
    rows: list[Row] = []
    for damage in ("one bit flipped at 10 %", "random bytes"):
        data = tmp / damage.replace(" ", "-")
        whole = _log_of_1000_keys(src, data)
        if damage == "random bytes":
            damaged = random.Random(23).randbytes(len(whole))
        else:
            at = len(whole) // 10
            damaged = whole[:at] + bytes([whole[at] ^ 0x10]) + whole[at + 1 :]
        (data / "store.log").write_bytes(damaged)
        outcome = _start_on(src, data)
        after = (data / "store.log").read_bytes()
        kept = "kept as it was" if after == damaged else f"rewritten ({len(after)} bytes)"
        rows.append(
            (f"a 1000-key log, {damage}: start; the file", f"{outcome}; {kept}", "refused; kept")
        )
    fifo = tmp / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "store.log")
    started = time.monotonic()
    outcome = _start_on(src, fifo)
    rows.append(
        (
            "store.log a FIFO: start",
            f"{outcome} after {time.monotonic() - started:.1f} s",
            "refused at once",
        )
    )
    return rows


def case_huge_px(src: Path, tmp: Path) -> list[Row]:
    answers = []
    for flags in ([], ["--data-dir", str(tmp / "data")]):
        with running(src, *flags) as emulator:
            client = emulator.client("c")
            answer = client.request("SET", "k", "v", "PX", str(2**63 - 1)).payload
            stored = client.request("GET", "k").payload
            client.close()
        answers.append(f"{_answer(answer)} / {_answer(stored)}")
    with running(src, "--data-dir", str(tmp / "data")) as emulator:
        client = emulator.client("c")
        restarted = client.request("GET", "k").payload
        client.close()
    return [
        (
            "SET k v PX 2^63-1 / GET k: in memory; with --data-dir; after a restart",
            f"{answers[0]}; {answers[1]}; {_answer(restarted)}",
            "alike",
        )
    ]


def case_kills(src: Path, tmp: Path) -> list[Row]:
    """15 SIGKILLs during heavy writes: every write answered +OK is there after a restart
    (or a later write of the same key, sent but not answered before the kill)."""
    data = tmp / "data"
    # key -> the value last acknowledged, and the values sent after it
    expected: dict[str, tuple[str | None, set[str]]] = {}
    lost = checked = acknowledged = 0
    for round_ in range(15):
        emulator = Emulator(src, "--data-dir", str(data))
        client = emulator.client(f"writer-{round_}")
        for key, (value, later) in expected.items():
            got = client.request("GET", key).payload
            if value is not None:
                checked += 1
                allowed = {value, *later}
                lost += not any(got == f"${len(v)}\r\n{v}\r\n".encode() for v in allowed)
        sent: list[tuple[str, str, Any]] = []

        def send(
            client: PahoStoreClient = client,
            round_: int = round_,
            sent: list[tuple[str, str, Any]] = sent,
        ) -> None:
            with contextlib.suppress(Exception):
                for i in range(4000):
                    key, value = f"k{i % 500}", f"{round_}-{i}"
                    sent.append((key, value, client.send("SET", key, value, acknowledged=False)))

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (len(sent) <= 500 or sent[500][2].empty()):
            time.sleep(0.001)
        emulator.proc.kill()  # once 500 writes are answered, with more on the way
        sender.join()
        emulator.proc.wait(10)
        time.sleep(0.2)
        for key, value, waiter in sent:
            last, later = expected.get(key, (None, set()))
            try:
                answered = waiter.get_nowait().payload == OK
            except Exception:
                answered = False
            if answered:
                acknowledged += 1
                expected[key] = (value, set())
            else:
                later.add(value)
                expected[key] = (last, later)
        with contextlib.suppress(Exception):
            client.close()
        emulator.stop()
    return [
        (
            "15 SIGKILLs, each once 500 writes are answered: acknowledged writes lost",
            f"{lost} of {checked} checked ({acknowledged} acknowledged in all)",
            "0: a reply waits for its record to be fsynced",
        )
    ]


def _one_line(result: subprocess.CompletedProcess[str] | None, seconds: float) -> str:
    """How a command ended: its exit, when, and its last line (or that it was a traceback)."""
    if result is None:
        return f"still running after {seconds:.0f} s"
    lines = result.stderr.strip().splitlines() or [""]
    last = lines[-1] if len(lines[-1]) < 70 else lines[-1][:67] + "..."
    shape = "a traceback" if "Traceback" in result.stderr else repr(last)
    return f"exit {result.returncode} after {seconds:.1f} s: {shape}"


def _run(src: Path, args: Sequence[str], timeout: float) -> tuple[str, str]:
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "agent", *args],
            cwd=src,
            env={**os.environ, "PYTHONPATH": str(src)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return _one_line(None, timeout), ""
    return _one_line(result, time.monotonic() - started), result.stderr


def case_cli(src: Path, tmp: Path) -> list[Row]:
    rows: list[Row] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        said, _ = _run(src, ["emulator", "--port", port], 30)
        rows.append(("--port in use", said, "exit != 0, one line saying why"))
        said, _ = _run(src, ["emulator", "--external", f"mqtt://127.0.0.1:{port}"], 45)
        rows.append(
            ("--external, a broker that never answers", said, "exit != 0, one line saying why")
        )
        emulator = Emulator(src, "--external", f"mqtt://127.0.0.1:{port}", ready=False)
        time.sleep(1.0)
        started = time.monotonic()
        emulator.proc.send_signal(signal.SIGINT)
        try:
            emulator.proc.wait(40)
            waited = f"exit {emulator.proc.returncode} after {time.monotonic() - started:.1f} s"
        except subprocess.TimeoutExpired:
            waited = "still running after 40 s"
        emulator.stop(signal.SIGKILL)
        shape = "traceback" if "Traceback" in emulator.logged() else "no traceback"
        rows.append(("... and Ctrl-C while it waits", f"{waited}, {shape}", "at once"))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    said, _ = _run(src, ["emulator", "--external", f"mqtt://127.0.0.1:{port}"], 45)
    rows.append(("--external, nothing listening", said, "exit != 0, one line saying why"))
    with running(src, "--data-dir", str(tmp / "data")):
        said, _ = _run(src, ["emulator", "--port", "0", "--data-dir", str(tmp / "data")], 10)
    rows.append(
        ("a second emulator on the same --data-dir", said, "exit != 0, one line saying why")
    )
    return rows


def case_plain_on_tls(src: Path, tmp: Path) -> list[Row]:
    from tests.emulator.certs import Authority

    ca = Authority(tmp)
    server = ca.issue("localhost", server=True)
    with running(src, "--tls-cert", str(server.cert), "--tls-key", str(server.key)) as emulator:
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "agent", "store", "--host", "127.0.0.1",
             "--port", str(emulator.port), "get", "k"],
            cwd=src, env={**os.environ, "PYTHONPATH": str(src)},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        took = time.monotonic() - started
        time.sleep(0.2)
        logged = emulator.logged()
    hint = "names TLS" if "TLS port?" in result.stderr else "no hint"
    server_log = "says plain MQTT" if "plain MQTT" in logged else "TLS error only"
    return [
        (
            "agent store (plain) on a TLS port: client; server log",
            f"exit {result.returncode} after {took:.1f} s, {hint}; {server_log}",
            "a TLS hint; plain MQTT named",
        )
    ]


FUZZ_SECONDS = 60.0


def _seeds(client_id: str) -> list[bytes]:
    """Valid packet sequences to mutate: a connect, and what a store client sends."""
    response = topics.response_topic(client_id)
    connect = mp.encode(mp.Connect(client_id, keep_alive=30))
    return [
        connect,
        connect + mp.encode(mp.Subscribe(1, [mp.Subscription(response, 1)])),
        connect + mp.encode(store_request(response, b"SET", b"fuzz", b"v", packet_id=2)),
        connect + mp.encode(store_request(response, b"KEYNOTIFY", b"fuzz", packet_id=3)),
        connect + mp.encode(mp.Publish("t", b"x", 0)) + mp.encode(mp.Pingreq()),
        connect + mp.encode(mp.Unsubscribe(4, ["a/#"])) + mp.encode(mp.Disconnect(0)),
    ]


def _mutated(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(5)
        at = rng.randrange(len(out) + 1)
        if kind == 0 and out:  # a bit flipped
            out[min(at, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif kind == 1:  # cut
            del out[at:]
        elif kind == 2:  # bytes inserted
            out[at:at] = rng.randbytes(rng.randint(1, 16))
        elif kind == 3:  # a huge remaining length
            out[at:at] = b"\xff\xff\xff\x7f"
        else:  # a stretch repeated
            out[at:at] = out[at : at + rng.randint(1, 64)] * rng.randint(2, 8)
        if not out:
            out = bytearray(data[:1])
    return bytes(out)


def case_fuzz(src: Path, tmp: Path, seconds: float = FUZZ_SECONDS) -> list[Row]:
    """Mutated packet sequences on live sockets, some a byte at a time; a store client is
    timed meanwhile."""
    deadline = time.monotonic() + seconds
    counts = {"sequences": 0}
    with running(src) as emulator:

        def fuzz(worker: int) -> None:
            rng = random.Random(worker)
            seeds = _seeds(f"fuzz-{worker}")
            while time.monotonic() < deadline:
                data = _mutated(rng.choice(seeds), rng)
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", emulator.port), timeout=2) as sock,
                ):
                    if rng.random() < 0.1:
                        for byte in data[:200]:
                            sock.sendall(bytes((byte,)))
                    else:
                        sock.sendall(data)
                    sock.settimeout(0.05)
                    with contextlib.suppress(OSError):
                        sock.recv(65536)
                counts["sequences"] += 1
                time.sleep(0.02)  # within the connection rate (200 a second)

        workers = [threading.Thread(target=fuzz, args=(i,)) for i in range(4)]
        for worker in workers:
            worker.start()
        client = emulator.client("well-behaved")
        latencies = []
        while time.monotonic() < deadline:
            started = time.monotonic()
            assert client.request("GET", "k").payload == b"$-1\r\n"
            latencies.append(time.monotonic() - started)
            time.sleep(0.01)
        for worker in workers:
            worker.join()
        client.close()
        alive = emulator.proc.poll() is None
        logged = emulator.logged()
    latencies.sort()
    tracebacks = logged.count("Traceback")
    return [
        (
            f"{seconds:.0f} s of mutated sequences (4 threads): sequences; alive; tracebacks",
            f"{counts['sequences']}; {'yes' if alive else 'NO'}; {tracebacks}",
            "alive; 0 tracebacks",
        ),
        (
            "a store client meanwhile: GETs, p99 and slowest answer",
            f"{len(latencies)}, {latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms, "
            f"{latencies[-1] * 1000:.1f} ms",
            "every one answered",
        ),
    ]


CASES: dict[str, Case] = {
    "fuzz": case_fuzz,
    "sat-name": case_sat_name,
    "response-topic": case_response_topic,
    "will": case_will,
    "connect-flood": case_connect_flood,
    "registrations": case_registrations,
    "fan-out": case_fan_out,
    "full-disk": case_full_disk,
    "damaged-log": case_damaged_log,
    "huge-px": case_huge_px,
    "kills": case_kills,
    "cli": case_cli,
    "plain-on-tls": case_plain_on_tls,
}


@dataclass
class Result:
    case: str
    rows: list[Row]


def run_case(name: str, src: Path) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            return CASES[name](src, Path(tmp))
        except Exception as error:  # a checkout that does not get that far: say so
            return [(name, f"failed: {type(error).__name__}: {str(error)[:60]}", "")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a checkout to measure the same way")
    parser.add_argument("--only", nargs="*", choices=list(CASES), help="cases to run")
    parser.add_argument("--fuzz-seconds", type=float, default=FUZZ_SECONDS)
    arguments = parser.parse_args(argv)
    CASES["fuzz"] = functools.partial(case_fuzz, seconds=arguments.fuzz_seconds)
    names = arguments.only or list(CASES)
    for name in names:
        now = run_case(name, ROOT)
        before = run_case(name, arguments.before.resolve()) if arguments.before else None
        for index, (figure, measured, bound) in enumerate(now):
            print(f"[{name}] {figure}")
            if before is not None:
                print(f"    before: {before[index][1] if index < len(before) else '-'}")
            print(f"    now:    {measured}")
            print(f"    bound:  {bound}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
