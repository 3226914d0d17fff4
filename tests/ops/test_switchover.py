"""`agent switchover`: a planned handover between agent processes, nothing killed."""

from __future__ import annotations

import queue
import re

from tests.ops.support import Topics, command, health_topic, wait_in_sync, wait_pair
from tests.support.rig import ACTIVE, STANDBY, LineRig

LINE = LineRig.LINE
LOCK = f"{LINE}\\lock"
SWITCHED = re.compile(r"switched over line floor3 from (\S+) to (\S+) in (\d+) ms")


def watch_lock(line: LineRig) -> None:
    """The line's lock changes arrive on `line.client.notifications` from now on."""
    assert line.client.request("KEYNOTIFY", LOCK).payload == b"+OK\r\n"
    while not line.client.notifications.empty():
        line.client.notifications.get_nowait()


def holder(line: LineRig) -> bytes | None:
    value = line.store_value(LOCK)
    return None if value is None else value.split(b"#", 1)[0]


def lock_changes(line: LineRig, until_holder: str, timeout: float = 10.0) -> list[tuple[str, str]]:
    """The lock's changes (kind, instance) from the watch, until `until_holder` holds it."""
    changes = []
    while True:
        try:
            payload = line.client.notifications.get(timeout=timeout).payload
        except queue.Empty:
            raise AssertionError(f"{until_holder} never took the lock: {changes}") from None
        if b"DELETE" in payload:
            changes.append(("DELETE", ""))
            continue
        holder = payload.rsplit(b"\r\n", 2)[-2].split(b"#", 1)[0].decode()
        if not changes or changes[-1] != ("SET", holder):
            changes.append(("SET", holder))
        if holder == until_holder:
            return changes


def test_switchover_hands_the_line_to_the_standby(line: LineRig, topics: Topics) -> None:
    first, _ = line.start_active("a")
    second = line.start_agent("b")
    second.wait_for_new(STANDBY)
    wait_pair(topics, LINE, "a", "b")
    wait_in_sync(topics, line.device_ids)
    watch_lock(line)

    result = command(line, "switchover", "t02")  # a device names its line
    assert result.returncode == 0, result.stderr
    match = SWITCHED.search(result.stdout)
    assert match and match.group(1, 2) == ("a", "b"), result.stdout
    print(f"\nswitchover: {match.group(3)} ms")
    # Released by a, then taken by b (before it, only renewals by a).
    changes = lock_changes(line, "b")
    assert changes[-2:] == [("DELETE", ""), ("SET", "b")], changes
    assert set(changes[:-2]) <= {("SET", "a")}, changes
    first.wait_for(re.compile(r"handing over: switchover to a standby requested by"))
    second.wait_for_new(ACTIVE)
    # The former active stands aside: b renews, a stays standby; the request is gone.
    line.expect_renewal("b", timeout=5)
    line.expect_renewal("b", timeout=5)
    assert line.store_value(f"{LINE}\\switchover") is None
    topics.wait(health_topic(LINE, "a"), lambda d: d["role"] == "standby")
    # b drives the line now.
    assert line.remote_set_device(3, b"23.0") == b"+OK\r\n"
    line.wait_line(lambda fake: fake.unit(3).setpoint == 23.0)


def test_switchover_to_a_named_standby(line: LineRig, topics: Topics) -> None:
    line.start_active("a")
    for name in ("b", "c"):
        line.start_agent(name).wait_for_new(STANDBY)
        topics.wait(health_topic(LINE, name), lambda d: d["role"] == "standby")
    watch_lock(line)
    result = command(line, "switchover", LINE, "--to", "c")
    assert result.returncode == 0, result.stderr
    assert SWITCHED.search(result.stdout).group(1, 2) == ("a", "c")  # type: ignore[union-attr]
    # Nobody but c took it, although b contends as soon as it sees the lock released.
    changes = lock_changes(line, "c")
    assert [c for c in changes if c[0] == "SET" and c[1] != "a"] == [("SET", "c")], changes
    assert holder(line) == b"c"


def test_switchover_refuses_what_it_cannot_do(line: LineRig, topics: Topics) -> None:
    unknown = command(line, "switchover", LINE)
    assert unknown.returncode == 7 and "no agent has reported" in unknown.stderr
    nobody = command(line, "switchover", LINE, "--force")
    assert nobody.returncode == 1 and "nobody holds the lock" in nobody.stderr
    line.start_active("a")
    topics.wait(health_topic(LINE, "a"), lambda d: d["role"] == "active")
    alone = command(line, "switchover", LINE)
    assert alone.returncode == 1 and "no standby up" in alone.stderr
    line.start_agent("b").wait_for_new(STANDBY)
    topics.wait(health_topic(LINE, "b"), lambda d: d["role"] == "standby")
    itself = command(line, "switchover", LINE, "--to", "a")
    assert itself.returncode == 1 and "already the active" in itself.stderr
    stranger = command(line, "switchover", LINE, "--to", "zz")
    assert stranger.returncode == 1 and "zz is not a standby that is up" in stranger.stderr
    assert command(line, "switchover", LINE, "--wait", "0").returncode == 2
    assert holder(line) == b"a"  # none of it moved anything


def test_a_switchover_nobody_takes_is_withdrawn_and_the_line_keeps_an_active(
    line: LineRig, topics: Topics
) -> None:
    first, _ = line.start_active("a")
    line.start_agent("b").wait_for_new(STANDBY)
    wait_pair(topics, LINE, "a", "b")
    # Forced towards an instance that does not exist: a hands over, b holds off for it.
    result = command(line, "switchover", LINE, "--to", "ghost", "--force", "--wait", "1")
    assert result.returncode == 4 and "the request is withdrawn" in result.stderr
    first.wait_for(re.compile(r"handing over: switchover to ghost"))
    assert line.store_value(f"{LINE}\\switchover") is None
    # Withdrawn: both contend again, and one of them drives the line.
    watch_lock(line)
    if holder(line) is None:
        line.client.notifications.get(timeout=10)  # the next SET
    assert holder(line) in (b"a", b"b")
    assert line.remote_set_device(1, b"24.0") == b"+OK\r\n"
    line.wait_line(lambda fake: fake.unit(1).setpoint == 24.0)
