"""The deployment on booted gateways: two Debian 12 containers with systemd as PID 1 (gw1 on
side a, gw2 on side b), the Debian package built by deploy/build-deb.sh and rolled out with the
project's playbook as the README says, serving one line of eight thermostats; the state store
and the line (`agent sim-device --units 8`) on this host, where the operator commands run too.

Slow (a few minutes) and needs root, debootstrap and systemd-nspawn: marked `gateway`, left
out of the default run, run by .ci/run on its own (``pytest -m gateway``). The tests share one
deployed pair and run in the order of this file; each starts from a settled pair (one active,
one standby) and leaves one behind.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from subprocess import CompletedProcess
from typing import Any

import pytest

from tests.deploy.gateways import requirements
from tests.deploy.pair import (
    DEVICE,
    DEVICES,
    HANDOVER_BOUND_S,
    LINE,
    LOCK_KEY,
    MQTT_PASSWORD,
    SETPOINT_KEY,
    TTL_S,
    UNIT,
    LockEvent,
    PairSite,
    gaps_without_active,
    holder_changes,
    lock_watch,
    store_set,
)
from tests.support.ports import free_port

pytestmark = [pytest.mark.gateway, pytest.mark.timeout(600)]

ENV_FILE = f"/etc/agent/{LINE}.env"
CREDENTIAL = f"/etc/credstore/agent.{LINE}.mqtt-password"
DROP_IN = f"/run/systemd/system/{UNIT}.d"
MAX_EXPOSURE = 2.0


@dataclass
class Deployed:
    site: PairSite
    check_run: CompletedProcess[str]
    after_check: dict[str, str]
    deploy_run: CompletedProcess[str]


def _state(site: PairSite, name: str) -> str:
    """What a check run must not change on a gateway: package, files, enabled units."""
    return site[name].sh(
        "dpkg-query -W -f '${db:Status-Abbrev}' agent 2>/dev/null || echo absent;"
        " ls -a /etc/agent /etc/credstore /var/cache/agent 2>&1 || true;"
        " systemctl is-enabled chrony-wait.service || true"
    )


@pytest.fixture(scope="module")
def deployed() -> Iterator[Deployed]:
    reason = requirements()
    if reason:
        pytest.skip(reason)
    with PairSite() as site:
        before = {name: _state(site, name) for name in site.names}
        check_run = site.deploy(site.packages.old, check_mode=True, check=False)
        after_check = {name: _state(site, name) for name in site.names}
        assert after_check == before, "the check run changed the gateways"
        deploy_run = site.deploy(site.packages.old)
        yield Deployed(site, check_run, after_check, deploy_run)


@pytest.fixture
def site(deployed: Deployed) -> PairSite:
    return deployed.site


def python_version(deb_version: str) -> str:
    return deb_version.rsplit("-", 1)[0]


def recap(run: CompletedProcess[str]) -> dict[str, dict[str, int]]:
    """PLAY RECAP: host -> {ok, changed, failed, ...}."""
    hosts = {}
    for host, counts in re.findall(r"^(\S+)\s+: (ok=.*)$", run.stdout, re.M):
        hosts[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)}
    return hosts


# --------------------------------------------------------------------------- the playbook


def test_check_mode_works_on_gateways_without_the_package(deployed: Deployed) -> None:
    run = deployed.check_run
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert all(counts["failed"] == 0 for counts in recap(run).values()), run.stdout[-3000:]
    # What would be written is shown, and nothing was installed or written.
    assert "AGENT_INSTANCE_ID='gw1'" in run.stdout and "AGENT_SERIAL__URL=" in run.stdout
    assert f"/etc/agent/{LINE}.devices.json" in run.stdout
    for name, state in deployed.after_check.items():
        assert state.startswith("absent"), (name, state)
        assert "disabled" in state, (name, state)


def test_the_playbook_deploys_one_active_and_one_standby(deployed: Deployed) -> None:
    site = deployed.site
    assert set(recap(deployed.deploy_run)) == set(site.names)
    active, standby = site.roles()
    version = python_version(site.packages.old_version)
    # As the operator sees it: one active holding the lock, one standby, every device in sync.
    report = site.wait_status(0)
    roles = [(r["instance"], r["role"], r["state"]) for r in report["instances"]]
    assert roles == [(active, "active", "running"), (standby, "standby", "running")]
    assert [d["device"] for d in report["devices"]] == DEVICES
    assert all(d["in_sync"] and d["availability"] == "online" for d in report["devices"])
    words = {
        active: f"active for line {LINE}: 8 devices, 8 in sync",
        standby: f"standby for line {LINE} (8 devices)",
    }
    for name in site.names:
        gateway = site[name]
        journal = gateway.journal("-u", UNIT)
        assert f"agent {version} starting" in journal, journal
        assert gateway.unit(UNIT, "StatusText") == words[name]
        assert gateway.run("systemctl", "is-enabled", UNIT).stdout.strip() == "enabled"
        # The time service is chrony: its wait unit, not systemd-timesyncd's.
        assert gateway.run("systemctl", "is-enabled", "chrony-wait.service").stdout.strip() == (
            "enabled"
        )
        time_wait = gateway.run("systemctl", "is-enabled", "systemd-time-wait-sync", check=False)
        assert time_wait.stdout.strip() != "enabled"
        # No python3-apt was needed (nor fetched: the gateways have no package lists).
        assert gateway.run("dpkg-query", "-W", "python3-apt", check=False).returncode != 0
    assert site.holder() == active
    # Deployed, the password is a credential; --print-config, run by hand, finds it.
    printed = site.gateways.ssh(
        active,
        "/opt/agent/venv/bin/agent",
        "--env-file",
        ENV_FILE,
        "--line-id",
        LINE,
        "--print-config",
    )
    assert MQTT_PASSWORD not in printed.stdout + printed.stderr
    config = json.loads(printed.stdout)
    assert config["mqtt"]["password"] == f"set, from credential {CREDENTIAL}"
    assert config["instance_id"] == active


def test_journal_priorities_and_fields(site: PairSite) -> None:
    active, _ = site.roles()
    gateway = site[active]
    cursor = gateway.cursor()
    # A value no controller takes: the active logs a warning and leaves the controller alone.
    store_set(site.host, site.port, SETPOINT_KEY, "hot", "--fence-with", LOCK_KEY)
    gateway.wait_journal(r"setPoint 'hot' refused", unit=UNIT, after=cursor)
    store_set(site.host, site.port, SETPOINT_KEY, "21.5", "--fence-with", LOCK_KEY)
    gateway.wait_journal(r"21\.5", unit=UNIT, after=cursor)

    # As an operator asks: warnings only, of one device.
    warnings = gateway.journal("-u", UNIT, "-p", "warning", f"DEVICE={DEVICE}")
    assert "setPoint 'hot' refused" in warnings
    assert "started as" not in warnings and "became active" not in warnings
    entries = gateway.entries(after=cursor, unit=UNIT, DEVICE=DEVICE, INSTANCE=active)
    (warning,) = [e for e in entries if "'hot' refused" in e["MESSAGE"]]
    assert warning["PRIORITY"] == "4"
    assert warning["SYSLOG_IDENTIFIER"] == "agent"
    assert warning["MESSAGE"].startswith(f"[{LINE}/{DEVICE} {active}] ")
    assert warning["LINE"] == LINE and warning["ROLE"] == "active"
    assert warning["CODE_FILE"].endswith("/agent/sync/point_writes.py")
    assert warning["CODE_FUNC"] and int(warning["CODE_LINE"]) > 0
    assert warning["_SYSTEMD_UNIT"] == UNIT
    infos = [e for e in entries if e["PRIORITY"] == "6"]
    assert infos, "no info entries with the device's fields"
    assert not gateway.journal("-u", UNIT, "DEVICE=some-other-device").strip()


# --------------------------------------------------------------------------- failures


def test_takeover_after_the_active_is_killed(site: PairSite) -> None:
    seconds, killed, successor = site.takeover_after_kill()
    print(f"\ntakeover after SIGKILL: {seconds * 1000:.0f} ms (bound {TTL_S + 0.3:.1f} s)")
    assert seconds <= TTL_S + HANDOVER_BOUND_S
    assert site.roles() == (successor, killed)
    assert int(site[killed].unit(UNIT, "NRestarts")) >= 1


def test_handover_when_the_active_is_stopped(site: PairSite) -> None:
    mark = site.watch.mark()
    active, _ = site.roles()
    seconds, stopped, successor = site.handover_on_stop()
    print(f"\nhandover on stop: {seconds * 1000:.0f} ms (bound {HANDOVER_BOUND_S * 1000:.0f} ms)")
    assert seconds <= HANDOVER_BOUND_S
    changes = holder_changes(site.watch.since(mark), active)
    assert changes == [("DELETE", ""), ("SET", successor)], changes  # released, then taken
    assert "released the lock" in site[stopped].journal("-u", UNIT, "-n", "40")
    assert site.roles() == (successor, stopped)


def test_switchover_hands_over_without_stopping_anything(site: PairSite) -> None:
    restarts = {name: site[name].unit(UNIT, "NRestarts") for name in site.names}
    pids = {name: site[name].main_pid(UNIT) for name in site.names}
    mark = site.watch.mark()
    seconds, gap, former, successor = site.switchover()
    print(
        f"\nswitchover: {seconds * 1000:.0f} ms, {gap * 1000:.0f} ms without an active "
        f"(bound {HANDOVER_BOUND_S * 1000:.0f} ms)"
    )
    assert seconds <= HANDOVER_BOUND_S and gap <= HANDOVER_BOUND_S
    assert holder_changes(site.watch.since(mark), former) == [("DELETE", ""), ("SET", successor)]
    # Nothing stopped or restarted: the same processes, roles swapped.
    assert {name: site[name].main_pid(UNIT) for name in site.names} == pids
    assert {name: site[name].unit(UNIT, "NRestarts") for name in site.names} == restarts
    assert site.roles() == (successor, former)
    report = site.wait_status(0)
    assert report["holder"] == successor
    assert "handing over: switchover to a standby" in site[former].journal("-u", UNIT, "-n", "30")


def test_pause_and_resume_with_changes_on_both_sides(site: PairSite) -> None:
    active, standby = site.roles()
    mark = site.watch.mark()
    paused = site.command("pause", LINE, "--reason", "bus work")
    assert paused.returncode == 0, paused.stderr
    assert site[active].unit(UNIT, "StatusText") == (
        f"active for line {LINE}: paused, the line closed (8 devices)"
    )
    report = site.wait_status(6)
    assert report["holder"] == active and report["verdict"].startswith("paused: bus work")
    # A panel change at t02 and a remote change of t03 while the line is left alone.
    assert site.panel("@2 PANEL SP 17.5") == "@2 OK SP 17.5"
    remote = site.command("setpoint", "set", DEVICES[2], "24.5")
    assert remote.returncode == 0, remote.stderr
    # The active keeps the lock (renewals) and the standby does not take over.
    renewals = [
        site.watch.wait_event(lambda e: e.holder == active, after=mark + n, timeout=10)
        for n in range(4)
    ]
    assert all(e.kind == "SET" for e in renewals)
    assert all(e.holder == active for e in site.watch.since(mark))
    assert site.panel("@3 GET SP") == "@3 SP 20.0"  # nothing written
    assert site.command("setpoint", "get", DEVICES[1]).stdout.strip() == "20.0"  # nor published

    resumed = site.command("resume", LINE)
    assert resumed.returncode == 0, resumed.stderr
    report = site.wait_status(0)
    store = {d["device"]: d["store"] for d in report["devices"]}
    assert store[DEVICES[1]] == "17.5" and store[DEVICES[2]] == "24.5"
    assert site.panel("@3 GET SP") == "@3 SP 24.5"
    assert site.roles() == (active, standby)


# --------------------------------------------------------------------------- reloading a line


DEVICES_FILE = f"/etc/agent/{LINE}.devices.json"
RELOADED = re.compile(r"reloaded: (.*) \(configuration (\w+), was (\w+)\)")
# The agent's words, not systemd's "Reloading" nor those of `agent reload` (ExecReload=).
AGENT_RELOAD = r"(?<!agent )reload(ed)?( refused)?: "


def task_output(run: CompletedProcess[str], task: str) -> str:
    """What the play printed for a task of the role, on every host that ran it."""
    sections = run.stdout.split("\nTASK [")
    return "\n".join(s for s in sections if s.startswith(f"agent : {task}]"))


def listed(devices: list[str]) -> list[dict[str, Any]]:
    return [{"id": device, "address": DEVICES.index(device) + 1} for device in devices]


@dataclass
class Running:
    """What must not change while a line is reloaded: the processes and the lock's holder."""

    pids: dict[str, int]
    restarts: dict[str, str]
    holder: str
    mark: int
    cursors: dict[str, str]

    @classmethod
    def now(cls, site: PairSite) -> Running:
        active, _ = site.roles()
        return cls(
            pids={name: site[name].main_pid(UNIT) for name in site.names},
            restarts={name: site[name].unit(UNIT, "NRestarts") for name in site.names},
            holder=active,
            mark=site.watch.mark(),
            cursors={name: site[name].cursor() for name in site.names},
        )

    def check_unchanged(self, site: PairSite) -> None:
        assert {name: site[name].main_pid(UNIT) for name in site.names} == self.pids
        assert {name: site[name].unit(UNIT, "NRestarts") for name in site.names} == self.restarts
        # The holder renewed its lease throughout: nobody released or took the lock.
        assert holder_changes(site.watch.since(self.mark), self.holder) == []
        assert site.holder() == self.holder

    def messages(self, site: PairSite, name: str, pattern: str) -> list[str]:
        entries = site[name].entries(after=self.cursors[name], unit=UNIT)
        return [e["MESSAGE"] for e in entries if re.search(pattern, e["MESSAGE"])]


def reload_by_play(site: PairSite, devices: list[str], words: str) -> str:
    """The playbook run with the line's devices changed: each gateway's agent reloads (no
    restart), says what changed, and runs the configuration its files say."""
    before = Running.now(site)
    started = time.monotonic()
    run = site.deploy(site.packages.old, devices=listed(devices))
    took = time.monotonic() - started
    assert all(counts["failed"] == 0 for counts in recap(run).values()), run.stdout[-3000:]
    reloads = task_output(run, "Reload the agents whose devices alone changed")
    restarts = task_output(run, "Restart the agents whose settings changed")
    hashes = set()
    for name in site.names:
        assert f"changed: [{name}] => (item={LINE})" in reloads, reloads
        assert f"skipping: [{name}] => (item={LINE})" in restarts, restarts
        (said,) = before.messages(site, name, AGENT_RELOAD)
        found = RELOADED.search(said)
        assert found and found.group(1) == words, said
        hashes.add(found.group(2))
        installed = json.loads(site[name].path(DEVICES_FILE).read_text())
        assert [device["id"] for device in installed] == devices
        mode = site[name].run("stat", "-c", "%U:%G %a", DEVICES_FILE).stdout.strip()
        assert mode == "root:agent 640"
    before.check_unchanged(site)
    (new_hash,) = hashes
    report = site.wait_status(0)
    assert {i["config_hash"] for i in report["instances"]} == {new_hash}
    assert [d["device"] for d in report["devices"]] == devices
    print(f"\nplay that reloaded the line ({words}): {took:.0f} s")
    return new_hash


# docs/operations.md, "Reloading a line", as root on a gateway (where `agent` is the package's).
OPERATOR_RELOAD = "\n".join(
    [
        f"/opt/agent/venv/bin/agent --env-file {ENV_FILE} --line-id {LINE} --print-config"
        " | grep config_hash",
        f"systemctl reload agent@{LINE}",
        f"journalctl -u agent@{LINE} -n 5 -o cat",
    ]
)


@pytest.mark.timeout(900)
def test_a_play_that_only_changes_the_devices_reloads_the_line(site: PairSite) -> None:
    _, before = site.status()
    (old_hash,) = {i["config_hash"] for i in before["instances"]}
    last = DEVICES[-1]
    # --check --diff says what would change and that the agents would be reloaded, no more.
    running = Running.now(site)
    files = {name: site[name].path(DEVICES_FILE).read_text() for name in site.names}
    check = site.deploy(site.packages.old, devices=listed(DEVICES[:-1]), check_mode=True)
    assert f'-  {{"id": "{last}", "address": 8}}' in check.stdout
    said = task_output(check, "Say which agents a run would reload (check mode)")
    assert all(f"changed: [{name}] => (item={LINE})" in said for name in site.names), said
    assert {name: site[name].path(DEVICES_FILE).read_text() for name in site.names} == files
    assert not any(running.messages(site, name, AGENT_RELOAD) for name in site.names)
    running.check_unchanged(site)

    assert reload_by_play(site, DEVICES[:-1], f"removed {last}") != old_hash
    # Back on the line: served both ways at once, by the same processes.
    assert reload_by_play(site, DEVICES, f"added {last}") == old_hash
    remote = site.command("setpoint", "set", last, "23.5", "--wait", "10")
    assert remote.returncode == 0, remote.stdout + remote.stderr
    assert site.panel("@8 GET SP") == "@8 SP 23.5"
    assert site.panel("@8 PANEL SP 18.5") == "@8 OK SP 18.5"
    deadline = time.monotonic() + 10
    while site.command("setpoint", "get", last).stdout.strip() != "18.5":
        assert time.monotonic() < deadline, "the panel change did not reach the store"
        time.sleep(0.5)

    # By hand, as the operations guide says: a device's settings changed in the file, the
    # file checked, the agent reloaded; then the file as the playbook wrote it, again.
    running = Running.now(site)
    for name in site.names:
        gateway = site[name]
        path = gateway.path(DEVICES_FILE)
        written = path.read_text()
        changed = json.loads(written)
        changed[-1]["min_write_interval_s"] = 2
        path.write_text(json.dumps(changed))  # the same file: its owner and mode stay
        cursor = gateway.cursor()
        shown = re.search(r'"config_hash": "(\w+)"', gateway.sh(OPERATOR_RELOAD))
        assert shown and shown.group(1) != old_hash
        said = gateway.wait_journal(RELOADED.pattern, unit=UNIT, after=cursor)["MESSAGE"]
        assert f"reloaded: changed {last} (configuration {shown.group(1)}, was" in said
        path.write_text(written)
        cursor = gateway.cursor()
        gateway.run("systemctl", "reload", UNIT)
        said = gateway.wait_journal(RELOADED.pattern, unit=UNIT, after=cursor)["MESSAGE"]
        assert f"reloaded: changed {last} (configuration {old_hash}, was" in said
    running.check_unchanged(site)


@pytest.mark.timeout(900)
def test_a_play_with_an_invalid_devices_file_fails_and_the_line_runs_on(site: PairSite) -> None:
    bad = [*listed(DEVICES), {"id": f"{LINE}-t09", "address": 1}]
    words = f"address 1 is given to both {DEVICES[0]} and {LINE}-t09"
    files = {name: site[name].path(DEVICES_FILE).read_text() for name in site.names}
    before = Running.now(site)

    # Checked before it is installed: the play stops on side a, nothing changed anywhere.
    run = site.deploy(site.packages.old, devices=bad, check=False)
    assert run.returncode != 0 and recap(run)["gw1"]["failed"] == 1
    assert "invalid setting AGENT_DEVICES_FILE" in run.stdout and words in run.stdout
    assert "Reload the agents" not in run.stdout

    # Without the check, the agent itself refuses it: the play fails with its words, its file
    # is put back, and it runs on as it was.
    run = site.deploy(
        site.packages.old, devices=bad, check=False, extra_vars={"agent_validate_env": False}
    )
    assert run.returncode != 0 and recap(run)["gw1"]["failed"] == 1
    refusal = f"reload refused: invalid setting AGENT_DEVICES_FILE ({DEVICES_FILE}): {words}"
    assert f"floor3: {refusal}; running configuration" in run.stdout, run.stdout[-3000:]
    assert "TASK [agent : Put back the devices files whose change the agent refused]" in run.stdout
    said, *put_back = before.messages(site, "gw1", AGENT_RELOAD)
    assert refusal in said
    # The file put back is reloaded: the refusal no longer shows in status.
    assert [m for m in put_back if "reload: no device changed" not in m] == []
    assert not before.messages(site, "gw2", AGENT_RELOAD)  # side b was not touched
    assert {name: site[name].path(DEVICES_FILE).read_text() for name in site.names} == files
    before.check_unchanged(site)
    report = site.wait_status(0)
    assert [d["device"] for d in report["devices"]] == DEVICES


def test_crashes_and_manual_starts_stay_below_the_start_limit(site: PairSite) -> None:
    _, standby = site.roles()
    gateway = site[standby]
    for _ in range(3):  # three crashes, each restarted by systemd
        cursor = gateway.cursor()
        gateway.run("systemctl", "kill", "-s", "KILL", UNIT, check=False)
        site.wait_standby(standby, cursor)
    for _ in range(3):  # three restarts by an operator
        gateway.run("systemctl", "restart", UNIT)
    assert gateway.unit(UNIT, "ActiveState") == "active"
    assert "Start request repeated too quickly" not in gateway.journal("-u", UNIT)

    # A crash loop still ends in a failed unit (restarted faster here, to see it sooner).
    cursor = gateway.cursor()
    gateway.sh(
        f"mkdir -p {DROP_IN}; printf '[Service]\\nExecStart=\\nExecStart=/bin/false\\n"
        f"RestartSec=100ms\\n' > {DROP_IN}/crash.conf; systemctl daemon-reload"
    )
    try:
        gateway.run("systemctl", "restart", UNIT, check=False)
        gateway.wait_journal(r"Start request repeated too quickly", unit=UNIT, after=cursor)
        assert gateway.unit(UNIT, "ActiveState") == "failed"
        # Stopped at the burst: 20 starts within the interval, those above included.
        assert int(gateway.unit(UNIT, "NRestarts")) <= 20
    finally:
        cursor = gateway.cursor()
        gateway.sh(f"rm -rf {DROP_IN}; systemctl daemon-reload; systemctl reset-failed {UNIT}")
        gateway.run("systemctl", "start", UNIT)
        site.wait_standby(standby, cursor)


def test_a_configuration_error_fails_the_unit_with_78_and_no_restarts(site: PairSite) -> None:
    _, standby = site.roles()
    gateway = site[standby]
    env_file = gateway.path(ENV_FILE)
    good = env_file.read_text()
    env_file.write_text(good + "AGENT_LOCK__TTL_MS=5\n")
    try:
        cursor = gateway.cursor()
        failed = gateway.run("systemctl", "restart", UNIT, check=False)
        assert failed.returncode != 0
        assert gateway.unit(UNIT, "ActiveState") == "failed"
        assert gateway.unit(UNIT, "ExecMainStatus") == "78"
        # At error priority (the journal may take a moment to read the process's last words).
        gateway.wait_journal(
            r"agent: invalid setting AGENT_LOCK__TTL_MS \(lock\.ttl_ms\)",
            unit=UNIT,
            priority=3,
            after=cursor,
            timeout=10,
        )
        assert "invalid setting AGENT_LOCK__TTL_MS" in gateway.journal("-u", UNIT, "-p", "err")
        # No restart loop: still failed, and never restarted, well past RestartSec=5.
        time.sleep(7)
        assert gateway.unit(UNIT, "ActiveState") == "failed"
        assert gateway.unit(UNIT, "NRestarts") == "0"
        restarts = gateway.entries(after=cursor, unit=UNIT)
        assert not [e for e in restarts if "Scheduled restart" in e["MESSAGE"]]
    finally:
        env_file.write_text(good)
        cursor = gateway.cursor()
        gateway.run("systemctl", "reset-failed", UNIT)
        gateway.run("systemctl", "start", UNIT)
        site.wait_standby(standby, cursor)


def test_a_start_without_the_broker_returns_at_once_and_says_why(site: PairSite) -> None:
    """With the broker gone, `systemctl start` hung for TimeoutStartSec, then the start was
    retried for ever, saying only `connecting to the broker`: the start returns at once and
    the status line names the broker and what fails."""
    _, standby = site.roles()
    gateway = site[standby]
    env_file = gateway.path(ENV_FILE)
    good = env_file.read_text()
    closed = free_port()  # nothing listens there: each attempt is refused
    env_file.write_text(good + f"AGENT_MQTT__PORT={closed}\n")
    try:
        started = time.monotonic()
        gateway.run("systemctl", "restart", UNIT)
        assert time.monotonic() - started < 10
        assert gateway.unit(UNIT, "ActiveState") == "active"
        deadline = time.monotonic() + 15
        while "failing since" not in (status := gateway.unit(UNIT, "StatusText")):
            assert time.monotonic() < deadline, status
            time.sleep(0.2)
        assert re.fullmatch(
            rf"connecting to the broker {re.escape(site.host)}:{closed}; failing since "
            r"\d\d:\d\d:\d\d UTC: connection refused: nothing accepts connections there",
            status,
        ), status
        assert gateway.unit(UNIT, "NRestarts") == "0"
    finally:
        env_file.write_text(good)
        cursor = gateway.cursor()
        gateway.run("systemctl", "restart", UNIT)
        site.wait_standby(standby, cursor)


def test_the_watchdog_restarts_a_hung_agent_while_the_standby_takes_over(
    site: PairSite,
) -> None:
    active, standby = site.roles()
    hung, rescuer = standby, active  # the standby gets a short watchdog, then becomes active
    gateway = site[hung]
    cursor = gateway.cursor()
    gateway.sh(
        f"mkdir -p {DROP_IN}; printf '[Service]\\nWatchdogSec=3\\n' > {DROP_IN}/watchdog.conf;"
        f" systemctl daemon-reload; systemctl restart {UNIT}"
    )
    try:
        site.wait_standby(hung, cursor)
        site.handover_on_stop()  # rescuer stops and starts again: now `hung` is active
        assert site.roles() == (hung, rescuer)

        cursor = gateway.cursor()
        mark = site.watch.mark()
        stopped_at = time.monotonic()
        gateway.run("kill", "-STOP", str(gateway.main_pid(UNIT)))
        taken = site.watch.wait_event(
            lambda e: e.kind == "SET" and e.holder == rescuer, after=mark, timeout=15
        )
        assert taken.at - stopped_at <= TTL_S + HANDOVER_BOUND_S
        gateway.wait_journal(r"Watchdog timeout", unit=UNIT, after=cursor)
        site.wait_standby(hung, cursor)
        assert gateway.unit(UNIT, "NRestarts") == "1"
        assert site.holder() == rescuer
    finally:
        cursor = gateway.cursor()
        gateway.sh(f"rm -rf {DROP_IN}; systemctl daemon-reload; systemctl restart {UNIT}")
        site.wait_standby(hung, cursor)


# --------------------------------------------------------------------------- hardening


def test_the_agent_runs_in_its_sandbox(site: PairSite) -> None:
    active, _ = site.roles()
    gateway = site[active]
    security = gateway.run("systemd-analyze", "security", "--no-pager", UNIT).stdout
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", security)
    assert match, security
    print(f"\nsystemd-analyze security {UNIT} (as installed): {match.group(1)}")
    assert float(match.group(1)) <= MAX_EXPOSURE

    pid = gateway.main_pid(UNIT)
    status = dict(
        line.split(":\t", 1)
        for line in gateway.run("cat", f"/proc/{pid}/status").stdout.splitlines()
    )
    uid, gid = (
        gateway.run("id", "-u", "agent").stdout.strip(),
        gateway.run("id", "-g", "agent").stdout.strip(),
    )
    assert status["Uid"].split()[0] == uid and status["Gid"].split()[0] == gid
    assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"

    # As the agent's user, in the agent's own mount namespace: only its state directory (and
    # its private /tmp) can be written.
    probes = {
        f"/var/lib/agent/{LINE}/probe": True,
        "/tmp/probe": True,
        "/etc/agent/probe": False,
        "/opt/agent/probe": False,
        "/var/lib/probe": False,
        "/usr/local/probe": False,
        "/root/probe": False,
        "/home/probe": False,
        "/run/probe": False,
    }
    script = "; ".join(
        f"if touch {p} 2>/dev/null; then echo {p} yes; else echo {p} no; fi" for p in probes
    )
    out = gateway.run(
        "nsenter", "-t", str(pid), "-m", "-S", uid, "-G", gid, "sh", "-c", script
    ).stdout
    written = dict(line.split() for line in out.splitlines())
    assert {path: written[path] == "yes" for path in probes} == probes
    assert not gateway.path("/tmp/probe").exists()  # the private /tmp is not the host's
    gateway.run(
        "nsenter", "-t", str(pid), "-m", "rm", "-f", f"/var/lib/agent/{LINE}/probe", "/tmp/probe"
    )


# --------------------------------------------------------------------------- upgrades


def test_an_upgrade_on_the_active_gateway_hands_over(site: PairSite) -> None:
    active, standby = site.roles()
    events = site.upgrade(active, site.packages.new)
    changes = holder_changes(events, active)
    gateway = site[active]
    installed = gateway.run("dpkg-query", "-W", "-f", "${Version}", "agent").stdout
    assert installed == site.packages.new_version
    # The old agent released the lock before it stopped; the standby took it at once; the new
    # agent came back as standby.
    assert changes == [("DELETE", ""), ("SET", standby)], changes
    (gap,) = gaps_without_active(events)
    print(f"\nupgrade handover: {gap * 1000:.0f} ms (bound {HANDOVER_BOUND_S * 1000:.0f} ms)")
    assert gap <= HANDOVER_BOUND_S
    journal = gateway.journal("-u", UNIT, "-n", "30")
    assert "released the lock" in journal
    assert f"agent {python_version(site.packages.new_version)} starting" in journal
    assert site.roles() == (standby, active)

    # Reinstalling on the standby restarts it; the active keeps the lock throughout.
    events = site.upgrade(active, site.packages.new, "--reinstall")
    assert holder_changes(events, standby) == []
    assert site.roles() == (standby, active)


def test_the_playbook_downgrades_and_moves_the_pair_to_another_store(site: PairSite) -> None:
    """A new broker and the previous package at once: gw1 (side a) moves first, gw2's agent was
    stopped before, so the pair never holds a lock in each store; the newer package on one
    gateway is downgraded."""
    emulator, host, new_port = site.start_emulator("emulator-2")
    old_events_mark = site.watch.mark()
    with lock_watch(host, new_port, LOCK_KEY) as new_watch:
        run = site.deploy(site.packages.old, port=new_port)
        assert all(c["failed"] == 0 for c in recap(run).values())
        old_store = site.watch.since(old_events_mark)
        new_store = new_watch.since(0)
    for name in site.names:
        version = site[name].run("dpkg-query", "-W", "-f", "${Version}", "agent").stdout
        assert version == site.packages.old_version, name

    held_old = held_intervals(old_store, holder=site.holder())
    held_new = held_intervals(new_store)
    assert held_new, new_store
    last_old_release = max((end for _, end in held_old), default=0.0)
    first_new_take = min(start for start, _ in held_new)
    print(
        f"\nstore change: old store's lock free {first_new_take - last_old_release:.2f} s "
        "before the new store's was taken"
    )
    assert last_old_release < first_new_take, (old_store, new_store)
    assert site.holder() is None  # the old store's lock is free for good
    site.port, site.emulator = new_port, emulator
    site.watch.close()
    site.watch = site._stack.enter_context(lock_watch(host, new_port, LOCK_KEY))
    active, standby = site.roles()
    assert {active, standby} == set(site.names)


def held_intervals(events: list[LockEvent], holder: str | None = "") -> list[tuple[float, float]]:
    """When the lock was held, from a watch's events: [(taken, released)]; a lock held when
    the watch started (`holder` not "") counts from 0."""
    intervals, start = [], 0.0 if holder else None
    for event in events:
        if event.kind == "SET" and start is None:
            start = event.at
        elif event.kind == "DELETE" and start is not None:
            intervals.append((start, event.at))
            start = None
    if start is not None:
        intervals.append((start, float("inf")))
    return intervals


def test_remove_keeps_and_purge_deletes_the_configuration(site: PairSite) -> None:
    active, standby = site.roles()
    gateway = site[active]
    mark = site.watch.mark()
    gateway.run("apt-get", "remove", "--yes", "agent", timeout=300)
    events = site.watch.since(mark)
    assert holder_changes(events, active) == [("DELETE", ""), ("SET", standby)]
    assert max(gaps_without_active(events)) <= HANDOVER_BOUND_S
    assert gateway.unit(UNIT, "ActiveState") in ("inactive", "")
    kept = gateway.sh(
        f"ls {ENV_FILE} {CREDENTIAL} /etc/agent/agent.env.example /var/lib/agent/{LINE}/"
    )
    assert ENV_FILE in kept and CREDENTIAL in kept
    assert not gateway.path("/opt/agent/venv").exists()

    gateway.run("apt-get", "purge", "--yes", "agent", timeout=300)
    for path in ("/etc/agent", CREDENTIAL, "/var/lib/agent", "/var/lib/private/agent"):
        assert not gateway.path(path).exists(), path
    wants = gateway.sh("ls /etc/systemd/system/multi-user.target.wants/")
    assert "agent@" not in wants
    assert site.holder() == standby
    assert site[standby].unit(UNIT, "StatusText").startswith(f"active for line {LINE}: ")
