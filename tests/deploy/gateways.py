"""Booted Debian gateways on this machine, for tests and benchmarks of the deployment.

- `cached_rootfs()`: a Debian 12 root file system made by ``debootstrap --variant=minbase``, with
  systemd, sshd and Python; made once per package list and kept under /var/cache/agent-tests
  (``$AGENT_TEST_ROOTFS_CACHE``) where this machine lets us, else in a temporary directory.
- `Gateway`: one container booted from it with systemd as PID 1 (``systemd-nspawn -b``), on
  its own overlay of the cached tree, sharing the host's network: sshd listens on its own port
  of the loopback interface. `Gateway.run` runs a command inside (``nsenter``).
- `Gateways`: several of them, with an ssh key and an Ansible inventory that reaches them; all
  stopped and removed on exit, also after a failure.
- `Playbook`: the project's playbook, run as the README tells an operator, and inventories.

tests/deploy/pair.py builds on these: a deployed pair with its store and device on the host.

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
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.deploy.support import (
    ANSIBLE,
    ROOT,
)
from tests.deploy.support import run as _run
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
            if state and state != "offline":
                break
            # Nothing, or "offline": the init found may still be nspawn's short-lived helper
            # or a systemd that has not opened its socket yet: look for it again.
            time.sleep(0.1)
            self.init_pid = self._find_init(deadline)
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
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """A command inside the container, as root, with a clean environment."""
        if not self.init_pid:
            raise GatewayError(f"{self.name} is not booted")
        return _run(
            ["nsenter", "-t", str(self.init_pid), "-a", "env", "-i", *INSIDE_ENV, *args],
            check=check,
            timeout=timeout,
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
        playbook = shutil.which("ansible-playbook", path=tool_path())
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


def tool_path() -> str:
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
    lines: list[dict[str, Any]],
    settings: dict[str, Any],
    extra_vars: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One pair: `side_a` and `side_b` serve `lines` (the layout of inventory.example.yml)."""
    hosts = {
        name: {**gateways.connection_vars(name), "agent_instance_id": name}
        for name in (side_a, side_b)
    }
    return {
        "all": {
            "children": {
                "agent_gateways": {
                    "vars": {"agent_settings": settings, **(extra_vars or {})},
                    "children": {"pair_test": {"vars": {"agent_lines": lines}, "hosts": hosts}},
                },
                "agent_side_a": {"hosts": {side_a: {}}},
                "agent_side_b": {"hosts": {side_b: {}}},
            }
        }
    }
