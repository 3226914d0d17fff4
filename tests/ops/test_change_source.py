"""Where each point's last change came from (panel, remote, restored after a refusal or an
absence, as Matter's thermostat keeps a set point's change source): in the active's device
status, and in `agent status DEVICE`."""

from __future__ import annotations

import json
import re

from tests.ops.support import Topics, command, status, wait_change
from tests.support.rig import LineRig

LINE = LineRig.LINE


def test_status_says_where_each_points_last_change_came_from(line: LineRig, topics: Topics) -> None:
    active, _ = line.start_active(
        "a", AGENT_SERIAL__PROBE_INTERVAL_S="0.5", AGENT_HEALTH__INTERVAL_S="1"
    )
    assert line.remote_set_device(1, b"22.5") == b"+OK\r\n"
    line.background.call(lambda: line.unit(2).panel_setpoint(19.0))
    assert line.remote_set_device(3, b"99.0") == b"+OK\r\n"  # above its limit: refused
    assert line.remote_set_device(4, b"23.0") == b"+OK\r\n"
    line.wait_line(lambda fake: fake.unit(4).setpoint == 23.0)
    # A power cycle that ends once the agent has seen the unit leave, however slow the
    # machine (one of fixed length could end first: the unit's reset a panel change then).
    line.background.call(lambda: line.unit(4).fault("POWERCYCLE", 600))
    active.wait_for(re.compile(r"t04: not answering; quarantined"), timeout=15)
    line.background.call(lambda: line.unit(4).fault("CLEAR"))

    remote = wait_change(topics, "t01", "remote")
    assert remote["value"] == "22.5" and remote["version"] and remote["at"].endswith("Z")
    # The unit's value published at the start is from its panel too: the change to 19.0.
    assert wait_change(topics, "t02", "panel", value="19.0")["source"] == "panel"
    assert wait_change(topics, "t03", "restored after a refusal")["value"] == "20.0"
    assert wait_change(topics, "t04", "restored after an absence")["value"] == "23.0"

    _, document = status(line, "t01")
    rows = {d["device"]: d for d in document["lines"][0]["devices"]}
    assert rows["t01"]["changes"][0].startswith("setPoint 22.5: remote, "), rows["t01"]
    shown = command(line, "status", "t04")
    assert re.search(
        r"^ t04 setPoint 23\.0: restored after an absence, [\d.]+ s ago \(version \d",
        shown.stdout,
        re.M,
    ), shown.stdout
    assert " t01 setPoint" not in shown.stdout  # only the device asked about

    # The line's history keeps the refusal and the unit back, not every change.
    line.wait_key(
        f"{LINE}\\history",
        lambda raw: raw is not None and b"unit back" in raw and b"refused" in raw,
    )
    listed = command(line, "history", LINE, "--json")
    entries = json.loads(listed.stdout)["lines"][LINE]
    kept = {(e["event"], e["from"]) for e in entries}
    assert {("refused", "t03"), ("unit back", "t04")} <= kept, entries
    (refusal,) = [e for e in entries if e["event"] == "refused"]
    assert refusal["why"] == "setPoint 99.0 refused (99 is above the limit 35)"
