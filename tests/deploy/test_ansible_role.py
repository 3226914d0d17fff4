"""deploy/ansible: the playbook and the agent role, run on this machine against rendered
hosts (booted gateways: test_gateways.py), and reload_line.py."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dotenv import dotenv_values

from tests.deploy.support import (
    ANSIBLE,
    EXEC_START,
    LINE,
    parse_env_file,
    run,
    settings_from,
    tool,
)
from tests.deploy.test_deploy_files import udev_rules

pytestmark = pytest.mark.slow


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


def role_script(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """One of the role's scripts, loaded as a module, its waits made instant."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module.time, "sleep", lambda _: None)
    return module


@pytest.fixture
def reload_line(monkeypatch: pytest.MonkeyPatch) -> Any:
    return role_script(RELOAD_LINE, monkeypatch)


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


def test_reload_line_takes_the_agents_words_when_systemctl_reload_fails(reload_line: Any) -> None:
    """The unit's `agent reload` fails systemctl reload on a refusal: the words are the
    agent's, from the journal, all the same."""
    refusal = "reload refused: invalid setting AGENT_DEVICES_FILE (f): bad"
    gateway = FakeGateway([agent_said(f"{refusal}; running configuration h1")])

    def run(*args: str) -> str:
        said = gateway.run(*args)
        if args[:2] == ("systemctl", "reload"):
            raise reload_line.Failed(2, "systemctl reload agent@floor3.service: Job failed")
        return said

    reload_line.run = run
    assert reload_line.reload("floor3", 5.0) == (3, f"floor3: {refusal}; running configuration h1")


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


# --------------------------------------------------------------------------- Ansible: a start

STARTED_LINE = ANSIBLE / "roles" / "agent" / "files" / "started_line.py"


@pytest.fixture
def started_line(monkeypatch: pytest.MonkeyPatch) -> Any:
    return role_script(STARTED_LINE, monkeypatch)


def started_with(started_line: Any, states: list[tuple[str, str]]) -> tuple[int, str]:
    """What started_line.py says of a unit going through `states` (ActiveState, StatusText),
    the last one for as long as it is asked."""

    def run(*args: str) -> str:
        assert args[:2] == ("systemctl", "show") and args[-1] == "agent@floor3.service", args
        state, status = states.pop(0) if len(states) > 1 else states[0]
        return f"ActiveState={state}\nStatusText={status}\n"

    started_line.run = run
    return started_line.wait("floor3", 0.2)  # type: ignore[no-any-return]


def test_started_line_waits_until_the_agent_names_its_role(started_line: Any) -> None:
    """The agent is ready as soon as it runs: the play waits for its role instead."""
    connecting = "connecting to the broker 10.0.0.5:1883"
    states = [
        ("activating", ""),
        ("active", connecting),
        ("active", "starting"),
        ("active", "standby for line floor3 (8 devices)"),
    ]
    assert started_with(started_line, states) == (0, "floor3: standby for line floor3 (8 devices)")


def test_started_line_fails_with_the_status_line_when_the_agent_cannot_connect(
    started_line: Any,
) -> None:
    status = (
        "connecting to the broker 10.0.0.5:1883; failing since 10:02:03 UTC: "
        "connection refused: nothing accepts connections there"
    )
    code, said = started_with(started_line, [("active", status)])
    assert code == 2
    assert said == f"floor3: not active nor standby after 0 s: {status}"


def test_started_line_fails_when_the_agent_stops(started_line: Any) -> None:
    code, said = started_with(started_line, [("activating", ""), ("failed", "")])
    unit = "agent@floor3.service"
    assert (code, said) == (2, f"floor3: the agent is failed: see journalctl -u {unit}")
