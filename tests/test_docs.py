"""Every command of the README and of the operations guide is run, by this module or by the test
named beside it.

Each `sh` block of README.md and docs/operations.md has a marker on the line before it:

- `<!-- test: run NAME -->`: run here, as written, by the scenario NAME (below): each block as
  one bash script, in a directory of its own, with `agent` on the PATH (as an operator who
  activated the environment has it) and checked command by command: every command must exit
  0, or the code its comment names (`# exits 5: ...`). The only changes are the ports: a
  port a block names is replaced by a free one, so that a run never meets another's.
- `<!-- test: covered by PATH::TEST, ... (why) -->`: the commands need root and a booted
  system (systemd, apt, a gateway), and that test runs them there; this module checks that
  the test exists.
- `<!-- test: file NAME -->` before a block that is not a command (an env file, a devices
  file, a mosquitto.conf): the scenarios write it as NAME where the commands expect it.
- `<!-- test: python NAME -->` before a Python block of docs/store.md: the blocks of NAME run
  as one program, in order, against a local store on the port they name (replaced by a free
  one).

The README's two commands install packages and a virtual environment, which a test run cannot
redo: the part that differs as root and as a user with sudo is run here with stand-ins for
apt-get and sudo, `agent --simulate` is started from the checkout's environment and stopped
once it is ready, and `.ci/run` runs the test command itself, verbatim. Relative links of the
README and of every page under docs/ must lead to a file (and heading) of the repository.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.cli import SUBCOMMANDS
from tests.support.mosquitto import mosquitto_binary
from tests.support.ports import free_port
from tests.support.processes import READY_URL, AgentProcess

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
OPERATIONS = ROOT / "docs" / "operations.md"
STORE = ROOT / "docs" / "store.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
BIN = Path(sys.executable).parent
"""Where `agent` is: the environment running these tests."""

SCENARIOS = {
    "install-simulate",
    "install-tests",
    "tour",
    "config",
    "profiles",
    "ops",
    "ops-health",
    "certificates",
    "mosquitto",
}

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!-- test: (run|covered by|file|python) (.+?) -->\s*$")
_EXITS = re.compile(r"#.*\bexits (\d+)\b")
_HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")


# --------------------------------------------------------------------------- the blocks


@dataclass
class Block:
    page: Path
    line: int
    """The line of its first fence, 1-based."""
    lang: str
    text: str
    kind: str | None = None
    """run, covered by, file; None without a marker."""
    arg: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, lang = opening.groups()
        body: list[str] = []
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end])
            end += 1
        block = Block(page, index + 1, lang, "\n".join(body) + "\n")
        previous = index - 1
        while previous >= 0 and not lines[previous].strip():
            previous -= 1
        marker = _MARKER.match(lines[previous]) if previous >= 0 else None
        if marker is not None:
            block.kind, block.arg = marker.group(1), marker.group(2)
        found.append(block)
        index = end + 1
    return found


def marked(kind: str, arg: str) -> list[Block]:
    return [
        b for page in (README, OPERATIONS) for b in blocks(page) if (b.kind, b.arg) == (kind, arg)
    ]


def file_block(name: str) -> str:
    (block,) = marked("file", name)
    return block.text


@dataclass
class Command:
    line: int
    text: str
    expect: int = 0


def commands(block: Block) -> list[Command]:
    """The block's commands: a line, with its continuation lines and its here-document."""
    lines = block.text.splitlines()
    found: list[Command] = []
    index = 0
    while index < len(lines):
        first = index
        text = lines[index]
        while text.endswith("\\") and index + 1 < len(lines):
            index += 1
            text += "\n" + lines[index]
        index += 1
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        exits = _EXITS.search(text)
        heredoc = _HEREDOC.search(text.split("#", 1)[0])
        if heredoc is not None:
            while index < len(lines) and lines[index].strip() != heredoc.group(1):
                text += "\n" + lines[index]
                index += 1
            text += "\n" + lines[index]
            index += 1
        found.append(Command(block.line + 1 + first, text, int(exits.group(1)) if exits else 0))
    return found


def script(block: Block) -> str:
    """The block as a bash script that stops at the first command that exits otherwise than
    its comment says, naming it."""
    out = ['__fail() { echo "DOCS FAILED at $1: exit $2, expected $3" >&2; exit 99; }']
    for command in commands(block):
        where = f"{block.page.name}:{command.line}"
        out.append(command.text)
        out.append(
            f'__rc=$?; [ "$__rc" -eq {command.expect} ] || __fail {shlex.quote(where)} '
            f'"$__rc" {command.expect}'
        )
    return "\n".join(out) + "\n"


def with_ports(text: str, ports: dict[int, int]) -> str:
    for old, new in ports.items():
        text = re.sub(rf"(?<![0-9]){old}(?![0-9])", str(new), text)
    return text


def environment(**extra: str) -> dict[str, str]:
    """The tests' environment without settings of the agent, `agent` first on the PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_block(
    block: Block,
    cwd: Path,
    env: dict[str, str],
    *,
    ports: dict[int, int] | None = None,
    timeout: float = 90,
    scratch: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs the block as written (its ports replaced) in `cwd`, asserts every command did as
    said. The script is written to `scratch` (default: `cwd`)."""
    for command in commands(block):
        words = command.text.split()[:2]
        subcommand = words[1] if words[:1] == ["agent"] and len(words) > 1 else ""
        if re.fullmatch(r"[a-z][a-z-]*", subcommand) and subcommand not in SUBCOMMANDS:
            pytest.skip(f"{block.where}: agent {subcommand} is not in this build")
    path = (scratch or cwd) / f"block-{block.line}.sh"
    path.write_text(with_ports(script(block), ports or {}))
    # Files, not pipes: what a block leaves running in the background (it failed before its
    # last line) would hold a pipe open after the script ended.
    out_path, err_path = path.with_suffix(".out"), path.with_suffix(".err")
    with out_path.open("w") as out_file, err_path.open("w") as err_file:
        proc = subprocess.Popen(
            ["bash", str(path)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out_file,
            stderr=err_file,
            text=True,
            start_new_session=True,
        )
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
        # Whatever the block left running ends with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    out, err = out_path.read_text(), err_path.read_text()
    assert proc.returncode == 0, (
        f"{block.where} (exit {proc.returncode}, -9: not done within {timeout} s):\n"
        f"{out[-4000:]}\n{err[-4000:]}"
    )
    return subprocess.CompletedProcess(proc.args, 0, out, err)


# --------------------------------------------------------------------------- every block


def test_every_command_block_says_how_it_is_tested() -> None:
    unmarked = []
    for page in (README, OPERATIONS):
        for block in blocks(page):
            if block.lang == "sh" and block.kind not in ("run", "covered by"):
                unmarked.append(block.where)
            if block.kind == "run":
                assert block.lang == "sh", block.where
                assert block.arg in SCENARIOS, f"{block.where}: no scenario {block.arg!r} here"
    assert not unmarked, f"command blocks without a test marker: {unmarked}"


def test_every_scenario_has_its_blocks() -> None:
    for name in SCENARIOS:
        assert marked("run", name), f"no block runs in scenario {name}"


def test_blocks_covered_elsewhere_name_tests_that_exist() -> None:
    for page in (README, OPERATIONS):
        for block in blocks(page):
            if block.kind != "covered by":
                continue
            match = re.fullmatch(r"(\S+(?:, \S+)*) \((.+)\)", block.arg)
            assert match, f"{block.where}: 'covered by PATH::TEST, ... (why)'"
            for target in match.group(1).split(", "):
                path, _, name = target.partition("::")
                assert (ROOT / path).is_file(), f"{block.where}: no {path}"
                if name:
                    source = (ROOT / path).read_text()
                    assert f"def {name}(" in source, f"{block.where}: no {name} in {path}"


@pytest.mark.parametrize("page", [README, OPERATIONS], ids=lambda p: p.name)
def test_every_command_block_is_bash(page: Path) -> None:
    for block in blocks(page):
        if block.lang == "sh":
            result = subprocess.run(
                ["bash", "-n"], input=block.text, text=True, capture_output=True, check=False
            )
            assert result.returncode == 0, f"{block.where}: {result.stderr}"


# --------------------------------------------------------------------------- links


def slug(heading: str) -> str:
    """The anchor GitHub makes of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    in_block = False
    for line in page.read_text().splitlines():
        if _FENCE.match(line) or line.strip() == "```":
            in_block = not in_block
        elif not in_block and line.startswith("#"):
            base = slug(line.lstrip("#"))
            name, count = base, 0
            while name in found:
                count += 1
                name = f"{base}-{count}"
            found.add(name)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_into_the_repository(page: Path) -> None:
    text = page.read_text()
    assert "../shared" not in text and not re.search(r"(?<![\w-])protocol\.md", text), (
        f"{page.name} points to a document outside the repository"
    )
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        assert destination.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
        assert destination.exists(), f"{page.name}: {target} does not exist"
        if anchor:
            assert destination.suffix == ".md", f"{page.name}: {target}"
            assert anchor in anchors(destination), f"{page.name}: no heading for {target}"


# --------------------------------------------------------------------------- the README


def install_commands() -> tuple[str, str]:
    (simulate,) = marked("run", "install-simulate")
    (tests,) = marked("run", "install-tests")
    return simulate.text.strip(), tests.text.strip()


def test_the_readme_has_two_commands_for_root_and_for_sudo() -> None:
    prefix = "sudo=$(command -v sudo); $sudo apt-get update; $sudo apt-get install -y "
    for command in install_commands():
        assert "\n" not in command
        assert command.startswith(prefix), command
        assert " && python3 -m venv .venv && .venv/bin/pip install -e " in command
    simulate, tests = install_commands()
    assert simulate.endswith(" && .venv/bin/agent --simulate")
    assert tests.endswith(" && .venv/bin/python -m pytest")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    _, tests = install_commands()
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in lines, ".ci/run must run the README's test command as it is written"


@pytest.mark.parametrize("as_root", [True, False], ids=["root without sudo", "user with sudo"])
def test_the_install_step_runs_as_root_and_with_sudo(tmp_path: Path, as_root: bool) -> None:
    """The part of the two commands before the virtual environment, with apt-get (and sudo)
    stand-ins that write down how they were called: root, who has no sudo, runs apt-get
    itself; a user runs it through sudo."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    calls = tmp_path / "calls"
    (stubs / "apt-get").write_text(f'#!/bin/sh\necho "apt-get $*" >> {calls}\n')
    if not as_root:
        (stubs / "sudo").write_text(f'#!/bin/sh\necho "sudo $1" >> {calls}\nexec "$@"\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    for command in install_commands():
        calls.write_text("")
        install = command.split(" && python3 -m venv", 1)[0]
        packages = install.rsplit("apt-get install -y ", 1)[1]
        env = {"PATH": str(stubs), "HOME": str(tmp_path)}
        subprocess.run(["/bin/bash", "-c", install], env=env, check=True, cwd=tmp_path)
        expected = ["apt-get update", f"apt-get install -y {packages}"]
        if not as_root:
            expected = ["sudo apt-get", expected[0], "sudo apt-get", expected[1]]
        assert calls.read_text().splitlines() == expected


def test_agent_simulate_runs_until_ctrl_c() -> None:
    """The last step of the first command, from the checkout's environment: it prints what to
    try and stops on Ctrl-C, exit 0."""
    simulate, _ = install_commands()
    last = simulate.rsplit(" && ", 1)[1]
    assert last == ".venv/bin/agent --simulate"
    if not (ROOT / ".venv" / "bin" / "agent").exists():
        pytest.skip("no .venv in the checkout: the README's first command makes it")
    proc = subprocess.Popen(
        shlex.split(last),
        cwd=ROOT,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith("Stop with Ctrl-C."):
                break
        assert seen and seen[-1].startswith("Stop with Ctrl-C."), "".join(seen)
        assert any("agent setpoint set" in line for line in seen), "".join(seen)
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow  # 20 s; the README's test on a fresh Debian runs the tour too
@pytest.mark.timeout(240)
def test_the_tour_runs_as_written(tmp_path: Path) -> None:
    """The five-minute tour, command by command, from the checkout (it activates `.venv`):
    each command exits 0 or as its comment says."""
    if not (ROOT / ".venv" / "bin" / "activate").exists():
        pytest.skip("no .venv in the checkout: the README's first command makes it")
    (tour,) = marked("run", "tour")
    ports = {port: free_port() for port in (11883, 14001, 14002)}
    env = environment(TMPDIR=str(tmp_path))
    result = run_block(tour, ROOT, env, ports=ports, timeout=200, scratch=tmp_path)
    assert "19.5" in result.stdout.splitlines()  # the panel change, read from the store


# --------------------------------------------------------------------------- the guide


@pytest.mark.parametrize("name", ["config", "profiles"])
def test_configuration_examples(tmp_path: Path, name: str) -> None:
    for file in ("floor3.env", "floor3.devices.json"):
        (tmp_path / file).write_text(file_block(file))
    for block in marked("run", name):
        run_block(block, tmp_path, environment())


@dataclass
class Pair:
    """The line floor3 of the guide's examples: a store, eight thermostats, gw1 and gw2."""

    env: dict[str, str]
    ports: dict[int, int]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(BIN / "agent"), *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )


def _wait_line(log: Path, pattern: str, timeout: float = 20) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, log.read_text(errors="replace"))
        if match:
            return match
        time.sleep(0.05)
    raise TimeoutError(f"no {pattern!r} in {log}: {log.read_text(errors='replace')[-2000:]}")


def _status_exits(env: dict[str, str], code: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    result = None
    while time.monotonic() < deadline:
        result = subprocess.run(
            [str(BIN / "agent"), "status", "floor3"], env=env, capture_output=True, text=True
        )
        if result.returncode == code:
            return
        time.sleep(0.5)
    raise AssertionError(f"agent status floor3 did not exit {code}: {result}")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    work = tmp_path_factory.mktemp("pair")
    env = environment()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(_start(["emulator", "--port", "0"], work / "store.log", env))
        port = _wait_line(work / "store.log", r"ready at mqtt://127\.0\.0\.1:(\d+)").group(1)
        processes.append(
            _start(["sim-device", "--units", "8", "--tcp", "0"], work / "line.log", env)
        )
        line = _wait_line(work / "line.log", r"device (socket://\S+)").group(1)
        env = environment(AGENT_MQTT__HOST="127.0.0.1", AGENT_MQTT__PORT=port)
        agent_env = {
            **env,
            "AGENT_LINE_ID": "floor3",
            "AGENT_DEVICES": ",".join(f"floor3-t{n:02d}@{n}" for n in range(1, 9)),
            "AGENT_SERIAL__URL": line,
        }
        health = free_port()
        for name in ("gw1", "gw2"):
            own = {
                **agent_env,
                "AGENT_INSTANCE_ID": name,
                "AGENT_STATE_DIR": str(work / name),
            }
            if name == "gw1":
                own["AGENT_HEALTH__PORT"] = str(health)
            processes.append(_start([], work / f"{name}.log", own))
            # gw1 first: the examples' active; then gw2, its standby.
            _status_exits(env, 5 if name == "gw1" else 0)
        yield Pair(env, {9732: health}, processes)
    finally:
        for proc in reversed(processes):
            if proc.poll() is None:
                proc.terminate()
        for proc in processes:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _ops_blocks() -> list[Block]:
    # The health check first, while gw1 (the one with the HTTP port) is active; then the
    # guide's order, which its commands follow (switchover back to gw1, pause, resume).
    return marked("run", "ops-health") + marked("run", "ops")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("block", _ops_blocks(), ids=lambda b: f"line{b.line}")
def test_operating_a_pair(pair: Pair, block: Block, tmp_path: Path) -> None:
    run_block(block, tmp_path, pair.env, ports=pair.ports, timeout=150)


@pytest.mark.timeout(180)
def test_test_certificates_and_tls(tmp_path: Path) -> None:
    """The openssl recipe, then the local store with TLS and mutual TLS on those files."""
    for block in marked("run", "certificates"):
        run_block(block, tmp_path, environment(), ports={8883: free_port()}, timeout=150)


@pytest.mark.timeout(180)
def test_the_store_on_mosquitto(tmp_path: Path) -> None:
    """The sample mosquitto.conf with the recipe's certificates, the store served on it, and a
    client on its mutual TLS listener. As the guide says, the paths in the file point to where
    the certificates are; started as root, mosquitto would read them as user mosquitto, so
    here it stays the user that runs the test."""
    if mosquitto_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("mosquitto is required in CI")
        pytest.skip("mosquitto is not installed")
    recipe = marked("run", "certificates")[0]
    run_block(recipe, tmp_path, environment())
    conf = file_block("agent-store.conf").replace("/etc/mosquitto/certs/", f"{tmp_path}/")
    if os.geteuid() == 0:
        conf = "user root\n" + conf
    ports = {1883: free_port(), 8883: free_port()}
    (tmp_path / "agent-store.conf").write_text(with_ports(conf, ports))
    env = environment(PATH=f"{BIN}{os.pathsep}/usr/sbin{os.pathsep}{os.environ['PATH']}")
    for block in marked("run", "mosquitto"):
        run_block(block, tmp_path, env, ports=ports, timeout=150)


# --------------------------------------------------------------------------- the store page


def test_the_store_pages_paho_examples_run_against_a_local_store() -> None:
    examples = [b for b in blocks(STORE) if (b.kind, b.arg) == ("python", "paho")]
    assert len(examples) == 2 and all(b.lang == "python" for b in examples)
    store = AgentProcess(["emulator", "--port", "0"])
    try:
        port = int(store.wait_for(READY_URL).group(2))
        program = with_ports("".join(b.text for b in examples), {1883: port})
        done = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("b'+OK\\r\\n' "), done.stdout  # an answer and its version
    finally:
        store.stop()
