"""A line's history: the bounded codec (pure), why a takeover happened (pure), and `agent
history` against a real pair after a switchover, a pause and a killed active."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.client.errors import FencingTokenLowerVersion, RequestTimeout
from agent.client.statestore import KeyChange
from agent.config import AgentSettings
from agent.ops.control import PauseNote, SwitchoverRequest
from agent.ops.history import (
    MAX_BYTES,
    MAX_ENTRIES,
    MAX_TEXT,
    Entry,
    InvalidHistory,
    append,
    encode,
    parse,
)
from agent.ops.history_cli import show
from agent.protocol.hlc import Hlc
from agent.runtime.line_history import LineHistory, takeover
from tests.ops.support import Topics, command, report, wait_pair
from tests.support.rig import ACTIVE, STANDBY, LineRig

LINE = LineRig.LINE


def entry(n: int, why: str = "because") -> Entry:
    return Entry(f"2027-01-15T08:00:{n % 60:02d}.000Z", "takeover", f"gw{n}", f"gw{n + 1}", why)


# --------------------------------------------------------------------------- the codec


def test_the_table_states_its_zone_and_wraps_the_why_under_its_column() -> None:
    why = (
        "requested by alice@gw1 at 2027-01-15T08:00:01.250Z: the panel of floor3-t07 "
        "is replaced, and the technician needs the bus for about twenty minutes"
    )
    shown = show(LINE, [entry(2, why)], width=80).splitlines()
    assert shown[1].startswith("Time (UTC)")
    assert shown[2].startswith("2027-01-15 08:00:02  takeover  gw2")
    assert "2027-01-15 08:00:01:" in "\n".join(shown)  # the why's time as the table's, whole
    assert max(len(line) for line in shown) <= 80 and len(shown) > 3
    column = shown[1].index("Why")
    assert all(line[:column].isspace() for line in shown[3:])
    words = " ".join(line[column:] for line in shown[2:]).split()
    assert words == why.replace("T08:00:01.250Z", " 08:00:01").split()  # no word broken


def test_entries_round_trip_oldest_first() -> None:
    entries = [entry(1), Entry("2027-01-15T08:01:00.000Z", "step-down", "gw2", "", "lost")]
    raw = encode(entries)
    assert parse(raw) == entries
    assert json.loads(raw)[1] == {
        "time": "2027-01-15T08:01:00.000Z",
        "event": "step-down",
        "from": "gw2",
        "to": "",
        "why": "lost",
    }


def test_the_history_is_bounded_to_the_newest() -> None:
    raw = None
    for n in range(3 * MAX_ENTRIES):
        raw = append(raw, entry(n))
    assert raw is not None and len(raw) <= MAX_BYTES
    kept = parse(raw)
    assert 0 < len(kept) <= MAX_ENTRIES and kept[-1] == entry(3 * MAX_ENTRIES - 1)
    long = parse(append(None, entry(1, "x" * 10_000)))
    assert len(long[0].why) == MAX_TEXT


@pytest.mark.parametrize(
    "raw", [b"", b"\xff", b"{}", b"[1]", b'[{"why": 3}]', b"[" * 100_000, b"null"]
)
def test_what_is_not_a_history_is_said_so(raw: bytes) -> None:
    with pytest.raises(InvalidHistory):
        parse(raw)
    assert parse(append(raw, entry(1))) == [entry(1)]  # recorded afresh


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_value_is_a_history_or_invalid_never_a_crash(raw: bytes) -> None:
    with contextlib.suppress(InvalidHistory):
        parse(raw)


# --------------------------------------------------------------------------- why


def test_why_a_takeover_happened() -> None:
    ttl = 1.5
    assert takeover(None, None, None, ttl, None) == ("takeover", "nobody held the lock")
    assert takeover("a", 1_000_000, 1000.2, ttl, None) == ("takeover", "a released the lock")
    assert takeover("a", 1_000_000, 1001.6, ttl, None) == (
        "takeover",
        "the lease of a expired 1.6 s after its last renewal (killed, frozen or cut off "
        "from the store)",
    )
    assert takeover("a", None, None, ttl, None) == ("takeover", "the lease of a ended")
    request = SwitchoverRequest("a#0a1b", "b", "ops@laptop", "2027-01-15T08:00:00Z")
    assert takeover("a", 1_000_000, 1000.1, ttl, request) == (
        "switchover",
        "requested by ops@laptop at 2027-01-15T08:00:00Z",
    )
    # A request for another holder than the one that left says nothing of this takeover.
    assert takeover("c", 1_000_000, 1000.1, ttl, request)[0] == "takeover"


# --------------------------------------------------------------------------- processes


def history(line: LineRig, *args: str) -> list[dict[str, str]]:
    result = command(line, "history", LINE, "--json", *args)
    assert result.returncode == 0, result.stderr
    entries: list[dict[str, str]] = json.loads(result.stdout)["lines"][LINE]
    return entries


def wait_history(line: LineRig, count: int) -> list[dict[str, str]]:
    """Once the history key holds `count` entries (written on notifications)."""
    line.wait_key(f"{LINE}\\history", lambda raw: raw is not None and len(json.loads(raw)) >= count)
    return history(line)


def test_history_tells_takeovers_switchovers_and_pauses_with_why(
    line: LineRig, topics: Topics
) -> None:
    first, _ = line.start_active("a")
    second = line.start_agent("b")
    second.wait_for_new(STANDBY)
    wait_pair(topics, LINE, "a", "b")
    (started,) = wait_history(line, 1)
    assert (started["event"], started["from"], started["to"]) == ("takeover", "", "a")
    assert started["why"] == "nobody held the lock"

    assert command(line, "switchover", LINE).returncode == 0
    second.wait_for(re.compile(r"taking over from a by switchover: requested by \S+@\S+"))
    assert command(line, "pause", LINE, "--reason", "rewiring").returncode == 0
    assert command(line, "resume", LINE).returncode == 0
    entries = wait_history(line, 4)
    assert [(e["event"], e["from"], e["to"]) for e in entries] == [
        ("takeover", "", "a"),
        ("switchover", "a", "b"),
        ("pause", "b", ""),
        ("resume", "", "b"),
    ]
    assert entries[2]["why"].startswith("rewiring, by ")

    second.signal(signal.SIGKILL)  # the active: its lease expires at the store
    first.wait_for_new(ACTIVE, timeout=15)
    said = first.wait_for(re.compile(r"taking over from b: (the lease of b expired .*)"))
    last = wait_history(line, 5)[-1]
    assert (last["event"], last["from"], last["to"]) == ("takeover", "b", "a")
    assert last["why"] == said.group(1)

    table = command(line, "history", LINE, "--last", "2")
    assert table.returncode == 0, table.stderr
    rows = table.stdout.splitlines()
    headers = ["Time", "(UTC)", "Event", "From", "To", "Why"]
    assert rows[0] == f"Line {LINE}:" and rows[1].split() == headers
    entries_shown = [r for r in rows[2:] if not r.startswith(" ")]  # a long why wraps
    assert len(entries_shown) == 2 and " resume " in rows[2] and " takeover " in rows[3]


def test_history_of_nothing_and_of_garbage(line: LineRig) -> None:
    report(line, LINE, "a", line.device_ids)
    assert history(line) == []
    empty = command(line, "history", LINE)
    assert empty.returncode == 0 and "no history recorded yet" in empty.stdout
    assert line.client.request("SET", f"{LINE}\\history", "oops").payload == b"+OK\r\n"
    garbage = command(line, "history")
    assert garbage.returncode == 1 and "Traceback" not in garbage.stderr
    assert f"the history of line {LINE} in {LINE}\\history cannot be read: not JSON" in (
        garbage.stderr
    )
    assert command(line, "history", "floor4").returncode == 7


# --------------------------------------------------------------------------- the writer


class FakeStore:
    """get and set of one key, fenced as the store fences: a lower token is refused."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.value: bytes | None = None
        self.token: Hlc | None = None
        self.fail = fail

    async def get(self, key: str) -> tuple[bytes | None, None]:
        if self.fail is not None:
            raise self.fail
        return self.value, None

    async def set(self, key: str, value: bytes, *, fencing_token: Hlc) -> None:
        if self.token is not None and fencing_token < self.token:
            raise FencingTokenLowerVersion("the fencing token is lower")
        self.value, self.token = value, fencing_token


async def test_the_instance_records_what_it_did_fenced_and_best_effort(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FakeStore()
    tasks: list[asyncio.Future[object]] = []
    settings = AgentSettings(
        line_id="floor3", devices="t01@1", instance_id="b", serial={"url": "socket://x:1"}
    )
    leased = True
    history = LineHistory(
        settings,
        "0a1b",
        lambda: store,  # type: ignore[arg-type,return-value]
        lambda: None,
        lambda work: tasks.append(asyncio.ensure_future(work)) or tasks[-1],
        lambda: leased,
    )

    async def settled() -> list[tuple[str, str, str]]:
        await asyncio.gather(*tasks)
        return [(e.event, e.source, e.to) for e in parse(store.value or b"[]")]

    first, later = Hlc(1000, 0, "s"), Hlc(2000, 0, "s")
    history.saw_lock(KeyChange(b"floor3\\lock", "SET", b"a#ffff", Hlc(900, 0, "s")))
    history.took_over(first)
    history.paused(later, PauseNote("ops@x", "", "rewiring"))
    assert await settled() == [("takeover", "a", "b"), ("pause", "b", "")]
    leased = False
    history.stepped_down("local lease deadline passed")  # its lease is over: not written
    assert len(await settled()) == 2
    leased = True
    history.took_over(Hlc(3000, 0, "s"))  # under the next lease, ahead of its takeover
    assert await settled() == [
        ("takeover", "a", "b"),
        ("pause", "b", ""),
        ("step-down", "b", ""),
        ("takeover", "", "b"),
    ]
    history.handing_over()  # a switchover: the next active records it, not this step-down
    history.stepped_down("switchover to a requested by ops@x")
    history.resumed(None)  # not active: nothing to fence with, nothing recorded
    leased = False
    history.resumed(Hlc(3001, 0, "s"))  # the lease ended before the write: not recorded
    assert len(await settled()) == 4
    leased = True

    store.token = Hlc(9000, 0, "s")  # a newer active wrote since: this one's record is refused
    history.paused(later, PauseNote("ops@x", "", "again"))
    assert len(await settled()) == 4
    store.fail = RequestTimeout("no answer within 2 s")
    with caplog.at_level(logging.DEBUG, logger="agent"):
        history.paused(Hlc(9999, 0, "s"), PauseNote("", "", ""))
        history.resumed(Hlc(9999, 1, "s"))
        await asyncio.gather(*tasks)  # never raises
    said = [r for r in caplog.records if "could not record" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG]
