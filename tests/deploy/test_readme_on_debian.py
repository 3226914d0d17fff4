"""The README on a fresh Debian 12, as root (who has no sudo) and as a user who may use sudo.

A Debian 12 root file system as debootstrap makes it (minbase: no Python, no package lists),
with sudo and a user `op` in group sudo for the second case, and a copy of the checkout. In a
container on it (systemd-nspawn, sharing this machine's network for apt and pip), as that
user, from the checkout:

1. the README's first command, as written: it installs what it needs and runs
   `agent --simulate`, which is stopped with Ctrl-C (SIGINT) once it says what to try;
2. the five-minute tour, as written, command by command: each exits 0 or as its comment says
   (the ports replaced by free ones, as in tests/test_docs.py: the container shares this
   machine's loopback);
3. the README's test command, as written, with `PYTEST_ADDOPTS=tests/test_docs.py`: the whole
   suite takes minutes, and test_docs.py is the part that needs what the command installs
   beside Python (mosquitto, openssl, curl) and runs the README's and the guide's commands.

The container reaches the Debian mirror and the package index as this machine does (its
apt source; pip's CA bundle, PIP_CERT, where a proxy inspects TLS). Slow (minutes: package
downloads) and needs root, debootstrap and systemd-nspawn: marked `gateway`, left out of the
default run, run by .ci/run as a step of its own.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.gateways import _mount_overlay, cached_rootfs, requirements
from tests.deploy.support import ROOT
from tests.deploy.support import run as _run
from tests.support.ports import free_port
from tests.test_docs import install_commands, marked, script, with_ports

pytestmark = [pytest.mark.gateway, pytest.mark.timeout(3600)]

USER = "op"
MACHINE = f"readme-{os.getpid()}"
"""The container's name, and its host name."""

_FIRST_COMMAND = """\
setsid bash -c {command} > simulate.out 2>&1 < /dev/null &
pid=$!
for _ in $(seq 1800); do
  grep -q '^Stop with Ctrl-C.' simulate.out && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
if ! grep -q '^Stop with Ctrl-C.' simulate.out; then
  cat simulate.out; echo "the first command did not get ready" >&2; exit 11
fi
sleep 2
kill -INT -- "-$pid"
wait "$pid"; rc=$?
cat simulate.out
[ "$rc" -eq 0 ] || { echo "agent --simulate exited $rc after Ctrl-C" >&2; exit 12; }
"""


@pytest.fixture(scope="module", autouse=True)
def _can_boot() -> None:
    reason = requirements()
    if reason is not None:
        pytest.skip(reason)


def _checkout(target: Path) -> None:
    """The checkout's files as a clone has them (tracked, and new ones not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    files = [name.decode() for name in listed if name and (ROOT / name.decode()).is_file()]
    target.mkdir(parents=True)
    _run(["tar", "-C", ROOT, "-cf", target.parent / "checkout.tar", *files])
    _run(["tar", "-C", target, "-xf", target.parent / "checkout.tar"])


@pytest.fixture(params=["root", USER])
def machine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A fresh Debian 12 (sudo and the user op only for the second case), and the user."""
    user = request.param
    packages = ("ca-certificates",) if user == "root" else ("ca-certificates", "sudo")
    lower = cached_rootfs(packages, scratch=tmp_path)
    root, overlay = _mount_overlay(lower, tmp_path)
    try:
        # As the Debian installer leaves them (debootstrap writes neither): a host name and
        # /etc/hosts naming localhost and it, which sudo and `--host localhost` rely on.
        (root / "etc/hostname").write_text(f"{MACHINE}\n")
        (root / "etc/hosts").write_text(
            f"127.0.0.1\tlocalhost\n127.0.1.1\t{MACHINE}\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n"
        )
        home = "/root" if user == "root" else f"/home/{user}"
        if user != "root":
            inside(root, "root", f"useradd -m -s /bin/bash -G sudo {USER}")
            sudoers = root / "etc/sudoers.d" / USER
            sudoers.write_text(f"{USER} ALL=(ALL:ALL) NOPASSWD: ALL\n")
            sudoers.chmod(0o440)
        _checkout(root / home.lstrip("/") / "agent")
        if user != "root":
            inside(root, "root", f"chown -R {USER}: {home}/agent")
        yield root, user
    finally:
        if overlay:
            _run(["umount", "-l", root], check=False)


def _package_index() -> list[str]:
    """How this machine reaches the package index, for pip in the container: a CA bundle of
    its own (PIP_CERT, where a proxy inspects TLS) and an index URL, when it has them."""
    options: list[str] = []
    cert = os.environ.get("PIP_CERT")
    if cert and Path(cert).is_file():
        options += [f"--bind-ro={cert}:/run/host-ca.crt", "--setenv=PIP_CERT=/run/host-ca.crt"]
    for name in ("PIP_INDEX_URL", "PIP_DEFAULT_TIMEOUT"):
        if os.environ.get(name):
            options.append(f"--setenv={name}={os.environ[name]}")
    return options


def inside(root: Path, user: str, command: str, *, timeout: float = 1800) -> str:
    """A bash script in a container on `root`, as `user`, from the checkout (or /)."""
    home = "/root" if user == "root" else f"/home/{user}"
    chdir = f"{home}/agent" if (root / home.lstrip("/") / "agent").is_dir() else "/"
    result = subprocess.run(
        [
            "systemd-nspawn",
            "--quiet",
            "--register=no",
            "--keep-unit",
            f"--machine={MACHINE}",
            "--pipe",
            "--as-pid2",
            f"--directory={root}",
            f"--user={user}",
            f"--chdir={chdir}",
            "--setenv=LANG=C.UTF-8",
            *_package_index(),
            "bash",
            "-c",
            command,
        ],
        stdin=subprocess.DEVNULL,
        env={**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, (
        f"as {user}: {command[:200]}\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    )
    return result.stdout


def test_the_readme_on_a_fresh_debian(machine: tuple[Path, str]) -> None:
    root, user = machine
    first, tests = install_commands()

    # 1. The first command as written, stopped with Ctrl-C once it is ready.
    out = inside(root, user, _FIRST_COMMAND.replace("{command}", shlex.quote(first)))
    assert "agent setpoint set" in out, out[-3000:]
    assert (root / ("root" if user == "root" else f"home/{user}") / "agent/.venv").is_dir()

    # 2. The tour, command by command.
    (tour,) = marked("run", "tour")
    ports = {port: free_port() for port in (11883, 14001, 14002)}
    out = inside(root, user, with_ports(script(tour), ports), timeout=300)
    assert "19.5" in out.splitlines(), out[-3000:]

    # 3. The test command as written, its suite narrowed to the README's and guide's commands.
    out = inside(root, user, f"export PYTEST_ADDOPTS=tests/test_docs.py\n{tests}", timeout=3000)
    assert " passed" in out, out[-3000:]
