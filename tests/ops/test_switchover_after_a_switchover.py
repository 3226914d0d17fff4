"""`agent switchover --to X` right after X handed the line over (the operations guide's
two switchovers back to back): X's word as a standby may not be in yet, and X, still
saying it is the active while the lock says another holds it, was refused as "not a
standby that is up" (once in a loaded test run). The command now waits for its word, a
short while at most."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from agent.config.health import HealthSettings
from agent.message import Message
from agent.ops import view
from agent.ops.switchover_cli import _word_of_a_former_active
from agent.ops.view import LineSnapshot
from agent.protocol.hlc import Hlc


def health(instance: str, role: str) -> dict[str, Any]:
    return {
        "status": "up",
        "pid": 10,
        "time": time.time(),
        "line": "floor3",
        "instance": instance,
        "role": role,
        "state": "running",
        "paused": False,
        "ttl_ms": 3000,
        "heartbeat_s": 5.0,
        "devices": [],
    }


class Watch:
    """gw2 holds the lock; gw1 says what `roles` says, in turn, one word a read."""

    line = "floor3"
    health = HealthSettings()

    def __init__(self, *roles: str) -> None:
        self.roles = list(roles)
        self.reads = 0

    async def read(self) -> LineSnapshot:
        self.reads += 1
        role = self.roles.pop(0) if len(self.roles) > 1 else self.roles[0]
        return LineSnapshot(
            "floor3",
            holder=b"gw2#0a1b2c3d",
            lock_version=Hlc(int(time.time() * 1000), 0, "store"),
            health={"gw1": health("gw1", role), "gw2": health("gw2", "active")},
        )


class Retained:
    """Tells its listeners of each message `say()` gives it."""

    def __init__(self) -> None:
        self.listeners: list[Callable[[Message], None]] = []

    def on_message(self, listener: Callable[[Message], None]) -> None:
        self.listeners.append(listener)

    def say(self, topic: str) -> None:
        for listener in self.listeners:
            listener(Message(topic, b"{}"))


async def test_the_former_actives_word_as_a_standby_is_waited_for() -> None:
    watch, retained = Watch("active", "standby"), Retained()
    report = view.assess(await watch.read(), time.time())
    assert not any(r.instance == "gw1" and r.can_take_over for r in report.instances)
    waiting = asyncio.create_task(
        _word_of_a_former_active(watch, retained, report, "gw1", 10.0)  # type: ignore[arg-type]
    )
    await asyncio.sleep(0)  # waiting for gw1's word
    retained.say("devices/t01/status")  # another topic's message: not gw1's word
    for _ in range(3):  # a wakeup it took would have read the line again by now
        await asyncio.sleep(0)
    assert not waiting.done()
    assert watch.reads == 1, "the line read again for a message that was not gw1's"
    retained.say(Watch.health.instance_topic("floor3", "gw1"))  # saying it is a standby
    report = await asyncio.wait_for(waiting, 5)
    assert any(r.instance == "gw1" and r.can_take_over for r in report.instances)


async def test_an_instance_that_keeps_saying_it_is_the_active_is_waited_for_a_while_only() -> None:
    watch, retained = Watch("active"), Retained()
    report = view.assess(await watch.read(), time.time())
    started = time.monotonic()
    report = await _word_of_a_former_active(watch, retained, report, "gw1", 0.2)  # type: ignore[arg-type]
    assert time.monotonic() - started < 2
    assert not any(r.instance == "gw1" and r.can_take_over for r in report.instances)


async def test_a_standby_or_a_stranger_is_not_waited_for() -> None:
    for name in ("gw3", "gw1"):
        watch = Watch("standby")
        report = view.assess(await watch.read(), time.time())
        started = time.monotonic()
        await _word_of_a_former_active(watch, Retained(), report, name, 10.0)  # type: ignore[arg-type]
        assert time.monotonic() - started < 1
