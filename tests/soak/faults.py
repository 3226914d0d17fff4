"""The soak's faults, one at a time, picked at random (seeded) from a catalogue.

Of the pair and its links (group `pair`):

    kill, term, pause          the active, or the standby (SIGKILL, SIGTERM, SIGSTOP/SIGCONT)
    cut, blackhole, delay      an agent's link to the broker (the proxy)
    broker_restart             the broker restarts, the store keeping its contents (on disk)
    broker_restart_forget      the store restarts without them (the lock and keys vanish)
    broker_restart_lose_tail   the store restarts having lost its last 1 to 20 acknowledged
                               writes (its log's tail; the real service's failover can lose
                               it too): keys hold older values, or none
    line_unplug                the whole line goes away and comes back
    pause_to_expiry            the active is stopped until just before its lease expires at the
                               store (past its own deadline): it wakes up with the lock still
                               its own there

Of the units, exercising the driver's waits (group `unit`):

    unit_silent                one unit stops answering for seconds (it is quarantined)
    unit_lost_replies          one unit loses its replies for a moment (SILENT, < 1 s)
    unit_late                  one unit answers after the reply timeout (SLOW above it): the
                               sender has given up; on a p2p line the driver must wait for a
                               quiet line before its next request
    unit_slow                  one unit answers slowly, within the reply timeout (SLOW below)
    unit_garbage               one unit's replies are damaged (GARBAGE or BADSUM, a few)
    unit_stray                 stray noise before one unit's replies (STRAY, a few)
    line_noise                 noise on the whole line: every unit's next replies damaged

Combined, a second fault while the pair is still recovering from the first (group
`combined`):

    cut_standby_kill_active    the standby's link is reset (and refused for a moment), and
                               while it reconnects the active is killed
    delay_kill_holder          the holder's link is slowed, then the holder is killed (its
                               renewals still in the link reach the store after its death)
    double_restart             two store restarts within one TTL, at least one losing the
                               contents
    pause_active_unit_silent   the active is paused while a unit is silent: the standby takes
                               over a line with a unit that does not answer
    kill_during_takeover       the active is killed and started again at once, and whichever
                               instance the store grants the lock next is killed at once
    blackhole_restart          the active's link is a black hole while the store restarts

Each fault returns its span: when it began, when it ended (its last part, including bytes a
delayed link still held), and how long the line may be without an active after it.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

from agent.simulator.core import Faults as UnitFaults
from tests.soak.liveness import SLACK_S, FaultSpan
from tests.soak.world import PROBE_S, Agent, wait_until

if TYPE_CHECKING:
    from tests.soak.world import World

GROUPS: dict[str, dict[str, int]] = {
    # How often each fault is picked, relatively.
    "pair": {
        "kill": 3,
        "term": 2,
        "pause": 2,
        "cut": 2,
        "blackhole": 2,
        "delay": 1,
        "broker_restart": 2,
        "broker_restart_forget": 1,
        "broker_restart_lose_tail": 2,
        "line_unplug": 1,
        "pause_to_expiry": 1,
    },
    "unit": {
        "unit_silent": 1,
        "unit_lost_replies": 2,
        "unit_late": 2,
        "unit_slow": 1,
        "unit_garbage": 1,
        "unit_stray": 1,
        "line_noise": 1,
    },
    "combined": {
        "cut_standby_kill_active": 2,
        "delay_kill_holder": 2,
        "double_restart": 2,
        "pause_active_unit_silent": 1,
        "kill_during_takeover": 1,
        "blackhole_restart": 1,
    },
}
ALL = {kind: weight for group in GROUPS.values() for kind, weight in group.items()}
UNIT_FAULTS = frozenset(GROUPS["unit"]) - {"line_noise"}
NEEDS_PAIR = frozenset(GROUPS["combined"])
UNIT_BOUND_S = 3 * PROBE_S + SLACK_S
"""A quarantined unit is probed after PROBE_S, then twice as late: it answers again
within this after its fault."""


def catalogue(spec: str) -> dict[str, int]:
    """The faults named by `spec`: groups and kinds separated by commas ("all": every one)."""
    chosen: dict[str, int] = {}
    for word in (w.strip() for w in spec.split(",")):
        if word == "all":
            chosen.update(ALL)
        elif word in GROUPS:
            chosen.update(GROUPS[word])
        elif word in ALL:
            chosen[word] = ALL[word]
        elif word:
            raise ValueError(f"unknown fault or group {word!r}: {', '.join([*GROUPS, *ALL])}")
    return chosen


class Injector:
    def __init__(self, world: World, weights: dict[str, int]) -> None:
        self.world = world
        self.rng = world.rng
        self.weights = weights
        self.ttl_s = world.ttl_ms / 1000

    def pick(self) -> str:
        kinds = list(self.weights)
        kind = self.rng.choices(kinds, weights=[self.weights[k] for k in kinds])[0]
        if kind in NEEDS_PAIR and None in self.world.pair():
            return "kill"  # the combination needs an active and a standby
        return kind

    def bound(self, kind: str, *, forgot: bool = False) -> float:
        """How long the line may be without an active after `kind` ends."""
        return self.ttl_s + SLACK_S + (self.ttl_s if forgot else 0.0)

    def inject(self, kind: str) -> tuple[FaultSpan, int | None]:
        """Carries out one fault: its span, and the unit slot it hit (0: the whole line;
        None: no unit)."""
        started = time.monotonic()
        if kind in GROUPS["combined"] and None in self.world.pair():
            kind = "kill"  # the pair changed since the pick
        if kind in GROUPS["combined"] or kind == "pause_to_expiry":
            ended, unit, forgot = getattr(self, f"_{kind}")()
        elif kind in UNIT_FAULTS or kind == "line_noise":
            ended, unit, forgot = self._unit_fault(kind)
        else:
            ended, unit, forgot = self._single(kind)
        return FaultSpan(kind, started, ended, self.bound(kind, forgot=forgot)), unit

    # ------------------------------------------------------------------ one at a time

    def _single(self, kind: str) -> tuple[float, int | None, bool]:
        world = self.world
        target = self._target()
        if kind in ("kill", "term"):
            self._end(target, signal.SIGKILL if kind == "kill" else signal.SIGTERM)
            ended = time.monotonic()
            self._restart_later(target.name)
            return ended, None, False
        if kind == "pause":
            self._stop_for(target, self.rng.uniform(0.5, 2.5) * self.ttl_s)
            return time.monotonic(), None, False
        if kind in ("cut", "blackhole", "delay"):
            proxy = target.proxy
            if kind == "cut":
                world.background.call(proxy.cut)
                time.sleep(self.rng.uniform(0.2, 1.5))
                world.background.call(proxy.set_pass)
            elif kind == "blackhole":
                world.background.call(proxy.blackhole)
                time.sleep(self.rng.uniform(0.5, 2.0) * self.ttl_s)
                world.background.call(proxy.set_pass)
            else:
                delay = self.rng.uniform(0.1, 0.4) * self.ttl_s
                world.background.call(lambda: proxy.delay(delay))
                time.sleep(self.rng.uniform(1, 3) * self.ttl_s)
                world.background.call(proxy.set_pass)
                time.sleep(delay)  # what the link still held arrives until then
            return time.monotonic(), None, False
        if kind in ("broker_restart", "broker_restart_forget"):
            keep = kind == "broker_restart"
            world.restart_store(keep=keep, outage_s=self.rng.uniform(0.2, 2.0))
            return time.monotonic(), None, not keep
        if kind == "broker_restart_lose_tail":
            world.restart_store(
                keep=True, outage_s=self.rng.uniform(0.2, 2.0), losing=self.rng.randint(1, 20)
            )
            return time.monotonic(), None, True  # the lock may be gone: waited out as forgotten
        if kind == "line_unplug":
            seconds = self.rng.uniform(0.5, 3)
            world.background.call(lambda: world.line.fault("UNPLUG", seconds))
            time.sleep(seconds)
            return time.monotonic(), 0, False
        raise ValueError(f"unknown fault {kind!r}")

    def _pause_to_expiry(self) -> tuple[float, int | None, bool]:
        world = self.world
        active = world.active()
        if active is None:
            return time.monotonic(), None, False  # nobody to pause
        active.stopped = True
        active.process.signal(signal.SIGSTOP)
        time.sleep(0.05)  # a renewal on its way still lands
        lock = world.lock_key.encode()
        holder = active.name.encode()
        last = max(
            (
                e.at
                for e in world.checker.store
                if e.key == lock
                and e.command == "SET"
                and e.accepted
                and (e.value or b"").split(b"#")[0] == holder
            ),
            default=time.monotonic(),
        )
        wake = last + self.rng.uniform(0.93, 0.98) * self.ttl_s
        time.sleep(max(0.0, wake - time.monotonic()))
        active.process.signal(signal.SIGCONT)
        active.stopped = False
        return time.monotonic(), None, False

    def _unit_fault(self, kind: str) -> tuple[float, int | None, bool]:
        world = self.world
        slot = self.rng.choice(world.slots)
        unit = world.unit_at(slot)
        timeout = world.reply_timeout_s
        faults = unit.faults
        if kind == "unit_silent":
            seconds = self.rng.uniform(1, 5)
            world.background.call(lambda: unit.fault("SILENT", seconds))
            time.sleep(seconds)
        elif kind == "unit_lost_replies":
            seconds = self.rng.uniform(0.05, 0.8)
            world.background.call(lambda: unit.fault("SILENT", seconds))
            time.sleep(seconds)
        elif kind in ("unit_late", "unit_slow"):
            low, high = (1.2, 2.5) if kind == "unit_late" else (0.3, 0.8)
            ms = round(self.rng.uniform(low, high) * timeout * 1000)
            world.background.call(lambda: unit.fault("SLOW", ms))
            time.sleep(self.rng.uniform(1, 4))
            world.background.call(lambda: unit.fault("SLOW", 0))
        elif kind in ("unit_garbage", "unit_stray"):
            what = "STRAY" if kind == "unit_stray" else self.rng.choice(["GARBAGE", "BADSUM"])
            count = self.rng.randrange(1, 7 if what == "STRAY" else 5)
            world.background.call(lambda: unit.fault(what, count))
            self._drained(faults)
        else:  # line_noise
            what = self.rng.choice(["STRAY", "STRAY", "GARBAGE", "BADSUM"])
            count = self.rng.randrange(2, 3 * len(world.slots) + 3)
            world.background.call(lambda: world.line.fault(what, count))
            # Up to 99 damaged replies on a line that crawls meanwhile (each one a resync):
            # ended only once used up, or the next fault would meet the noise still on the
            # line and be blamed for its slowness (a unit's recovery once was).
            self._drained(world.line.faults, 60)
            return time.monotonic(), 0, False
        return time.monotonic(), slot, False

    def _drained(self, faults: UnitFaults, limit_s: float = 10) -> None:
        """Until the counted faults are used up (by the agent's requests), at most `limit_s`."""
        wait_until(
            lambda: not (faults.garbage or faults.stray or faults.bad_checksum),
            limit_s,
        )

    # ------------------------------------------------------------------ combinations

    def _cut_standby_kill_active(self) -> tuple[float, int | None, bool]:
        world = self.world
        active, standby = world.pair()
        assert active is not None and standby is not None
        proxy = standby.proxy

        def cut_and_refuse() -> None:
            proxy.cut()
            proxy.drop()

        refused_s = self.rng.uniform(0.0, 0.3)
        kill_after_s = self.rng.uniform(0.0, refused_s + 0.5)
        world.background.call(cut_and_refuse)
        passed = killed = None
        if kill_after_s < refused_s:
            time.sleep(kill_after_s)
            killed = self._end(active, signal.SIGKILL)
            time.sleep(max(0.0, refused_s - kill_after_s))
            world.background.call(proxy.set_pass)
            passed = time.monotonic()
        else:
            time.sleep(refused_s)
            world.background.call(proxy.set_pass)
            passed = time.monotonic()
            time.sleep(kill_after_s - refused_s)
            killed = self._end(active, signal.SIGKILL)
        self._restart_later(active.name)
        return max(passed, killed), None, False

    def _delay_kill_holder(self) -> tuple[float, int | None, bool]:
        world = self.world
        holder = world.active()
        assert holder is not None
        proxy = holder.proxy
        delay = self.rng.uniform(0.1, 0.4) * self.ttl_s
        world.background.call(lambda: proxy.delay(delay))
        time.sleep(self.rng.uniform(0.3, 1.2) * self.ttl_s)
        killed = self._end(holder, signal.SIGKILL)
        # Its last renewal may still be in the link: it reaches the store `delay` later.
        ended = killed + delay
        time.sleep(max(0.0, ended - time.monotonic()))
        self._restart_later(holder.name)
        return ended, None, False

    def _double_restart(self) -> tuple[float, int | None, bool]:
        world = self.world
        keeps = self.rng.choice([(False, False), (False, False), (True, False), (False, True)])
        world.restart_store(keep=keeps[0], outage_s=self.rng.uniform(0.05, 0.3) * self.ttl_s)
        time.sleep(self.rng.uniform(0.05, 0.4) * self.ttl_s)
        world.restart_store(keep=keeps[1], outage_s=self.rng.uniform(0.05, 0.3) * self.ttl_s)
        return time.monotonic(), None, not all(keeps)

    def _pause_active_unit_silent(self) -> tuple[float, int | None, bool]:
        world = self.world
        active = world.active()
        assert active is not None
        slot = self.rng.choice(world.slots)
        unit = world.unit_at(slot)
        silent_s = self.rng.uniform(1.0, 3.0) * self.ttl_s
        world.background.call(lambda: unit.fault("SILENT", silent_s))
        silent_until = time.monotonic() + silent_s
        time.sleep(self.rng.uniform(0.0, 0.3) * silent_s)
        self._stop_for(active, self.rng.uniform(1.2, 2.0) * self.ttl_s)
        time.sleep(max(0.0, silent_until - time.monotonic()))
        return time.monotonic(), None, False

    def _kill_during_takeover(self) -> tuple[float, int | None, bool]:
        world = self.world
        first, second = world.pair()
        assert first is not None and second is not None
        gone = self._end(first, signal.SIGKILL)
        restarted = world.start_agent(first.name)
        # Whoever the store grants the lock next (the standby, or the first one back
        # already) is killed at once, in the middle of its takeover.
        wait_until(lambda: self._granted_after(gone) is not None, 2 * self.ttl_s + 5)
        name = self._granted_after(gone)
        if name is None:
            world.stats.not_recovered.append(
                f"kill_during_takeover: nobody took the lock within {2 * self.ttl_s + 5:.1f} s"
            )
            return time.monotonic(), None, False
        victim = world.agents[name]
        killed = self._end(victim, signal.SIGKILL)
        survivor = second if victim is restarted else restarted
        # The fault lasts until the survivor has started (the first one, back) as well.
        wait_until(lambda: survivor.ready_at is not None, 30)
        ready = survivor.ready_at if survivor.ready_at is not None else time.monotonic()
        self._restart_later(victim.name)
        return max(killed, ready), None, False

    def _granted_after(self, moment: float) -> str | None:
        """The instance the store granted or renewed the lock for first after `moment`."""
        lock = self.world.lock_key.encode()
        found = None
        for event in reversed(self.world.checker.store):
            if event.at <= moment + 0.05:
                break
            if event.key == lock and event.command == "SET" and event.accepted:
                found = (event.value or b"").split(b"#")[0].decode(errors="replace")
        return found

    def _blackhole_restart(self) -> tuple[float, int | None, bool]:
        world = self.world
        active = world.active()
        assert active is not None
        world.background.call(active.proxy.blackhole)
        time.sleep(self.rng.uniform(0.2, 0.6) * self.ttl_s)
        keep = self.rng.random() < 0.5
        world.restart_store(keep=keep, outage_s=self.rng.uniform(0.1, 0.5) * self.ttl_s)
        time.sleep(self.rng.uniform(0.0, 0.5) * self.ttl_s)
        world.background.call(active.proxy.set_pass)
        return time.monotonic(), None, not keep

    # ------------------------------------------------------------------ helpers

    def _end(self, agent: Agent, sig: int) -> float:
        """Ends an agent process with `sig`; when it was gone."""
        agent.expected_exit = True
        agent.process.signal(sig)
        agent.process.proc.wait(15)
        return time.monotonic()

    def _stop_for(self, agent: Agent, seconds: float) -> None:
        agent.stopped = True
        agent.process.signal(signal.SIGSTOP)
        time.sleep(seconds)
        agent.process.signal(signal.SIGCONT)
        agent.stopped = False

    def _target(self) -> Agent:
        world = self.world
        active = world.active()
        standby = [a for a in world.agents.values() if a is not active and a.alive]
        if active is not None and (not standby or self.rng.random() < 0.7):
            return active
        return standby[0] if standby else next(iter(world.agents.values()))

    def _restart_later(self, name: str) -> None:
        # Back as the standby after a while: the pair is whole again before the next fault.
        time.sleep(self.rng.uniform(0.2, 1.0))
        self.world.start_agent(name)
