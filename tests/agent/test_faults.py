"""Faults at the worst moment, checked against the pair's invariants: one master on the line,
the newest token on every accepted write."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.protocol.resp3 import decode_request
from tests.support.rig import ACTIVE, STANDBY, STEPPED_DOWN, LineRig


@dataclass
class Write:
    at: float
    client: str
    key: bytes
    token: str | None
    accepted: bool


class StoreWatch:
    """Every request the store handles, in its own order (a hook on the pure store)."""

    def __init__(self, rig: LineRig) -> None:
        self.writes: list[Write] = []
        store = rig.store.store
        handle = store.handle

        def watched(client: str, payload: bytes, ts: Any, token: Any) -> Any:
            outcome = handle(client, payload, ts, token)
            try:
                args = decode_request(payload)
            except Exception:
                return outcome
            if args and args[0].upper() in (b"SET", b"DEL", b"VDEL") and len(args) > 1:
                accepted = outcome.reply.payload in (b"+OK\r\n", b":1\r\n")
                self.writes.append(Write(time.monotonic(), client, args[1], token, accepted))
            return outcome

        store.handle = watched  # type: ignore[method-assign]


@pytest.fixture
def line(tmp_path: Path) -> Iterator[LineRig]:
    rig = LineRig(tmp_path, 4)
    try:
        yield rig
    finally:
        rig.close()


def test_a_paused_active_resumed_after_two_leases_drives_nothing(line: LineRig) -> None:
    watch = line.background.call(lambda: StoreWatch(line))
    old, _ = line.start_active("a")
    new = line.start_agent("b")
    new.wait_for_new(STANDBY)
    line.wait_store({1: b"20.0"})
    old.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    new.wait_for_new(ACTIVE, timeout=10)
    # The new active writes with its newer token: a panel change it publishes.
    line.background.call(lambda: line.unit(2).panel_setpoint(18.5))
    line.wait_store({2: b"18.5"})
    while time.monotonic() < stopped_at + 2 * line.ttl_ms / 1000:
        time.sleep(0.05)  # the fault is the pause itself: two leases long
    resumed_at = time.monotonic()
    old.signal(signal.SIGCONT)
    old.wait_for_new(STEPPED_DOWN, timeout=10)
    line.remote_set_device(3, b"23.0")
    line.wait_line(lambda fake: fake.unit(3).setpoint == 23.0)

    # The line: after it resumed, the former active sent not a single frame.
    records = line.background.call(lambda: list(line.device.records))
    clients = sorted(
        {r.client for r in records}, key=lambda c: min(r.at for r in records if r.client == c)
    )
    old_client, new_client = clients[0], clients[-1]
    assert old_client != new_client
    assert not [r for r in records if r.client == old_client and r.at >= resumed_at]
    assert not [r for r in records if r.other_client is not None]  # no collision
    # The store: nothing of the former active's was accepted after it resumed.
    old_writes = [w for w in watch.writes if w.client.endswith("-a") and w.at >= resumed_at]
    assert not [w for w in old_writes if w.accepted and not w.key.endswith(b"lock")], old_writes
