"""What an instance says about itself and its devices, for monitoring and `agent status`.

- **Its health** (both instances): a retained message on `agents/<line>/<instance>/health`
  in thin-edge.io's `status/health` shape, `{"status":"up","pid":...,"time":...}`, with the
  role (active, standby), the state (running, paused, failing), the version, the lease
  (`ttl_ms`), the lock's token while active, the devices and how many are in sync. It is
  published on every change and every `health.interval_s` (a heartbeat). The session's Last
  Will, set at CONNECT, is the same topic with `{"status":"down",...}`, retained: a crash or
  a lost network says "down" at once; a clean stop publishes it itself.
- **Each device's status and availability** (the active only): retained messages on
  `devices/<device>/status` (store and controller values, last sync, errors) and
  `devices/<device>/availability` (`online` while the active drives the device and it
  answers, else `offline`), on change (at most once a second each) and every interval.
- **The unit's status line** (sd_notify STATUS=): the role and the sync state in words.

The documents and the words are built by pure functions; `Health` publishes them from what
the agent shows it: an `InstanceView`, a snapshot taken when something is due (health never
reaches into the agent; the agent drives health).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.client.session import Session, SessionError
from agent.message import Message
from agent.pair.leadership import Role
from agent.protocol.hlc import Hlc
from agent.runtime.telemetry import Snapshot
from agent.runtime.version import installed
from agent.sync import decisions
from agent.sync.decisions import InvalidRemoteValue

if TYPE_CHECKING:
    from agent.config import AgentSettings

log = logging.getLogger("agent")

CONTENT_TYPE = "application/json"
DEVICE_MIN_INTERVAL_S = 1.0
"""A device's status is published at most this often on change."""
TICK_S = 1.0
PUBLISH_TIMEOUT_S = 2.0
NAMED_IN_WORDS = 3
"""Devices named in the status line's lists; more are counted."""

ONLINE, OFFLINE = b"online", b"offline"


# --------------------------------------------------------------------------- pure


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One device as the active sees it."""

    id: str
    answering: bool
    in_sync: bool


def in_sync(store: bytes | None, controller: float | None) -> bool:
    """The store and the controller hold the same set point."""
    if store is None or controller is None:
        return False
    try:
        return decisions.same(decisions.parse_setpoint(store), controller)
    except InvalidRemoteValue:
        return False


def _named(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:NAMED_IN_WORDS])
    return shown + (f", +{len(ids) - NAMED_IN_WORDS}" if len(ids) > NAMED_IN_WORDS else "")


def status_words(
    role: str, line: str, *, single: bool, devices: Sequence[DeviceHealth], paused: bool
) -> str:
    """The unit's status line: `active for line floor3: 32 devices, 31 in sync, 1 not
    answering (t07)`; for a single device, `active for thermostat-1: in sync`."""
    where = line if single else f"line {line}"
    count = f"{len(devices)} device{'s' if len(devices) != 1 else ''}"
    if role != "active":
        words = f"{role} for {where}" + ("" if single else f" ({count})")
        return words + (", paused" if paused else "")
    if paused:
        return f"active for {where}: paused, the line closed" + ("" if single else f" ({count})")
    silent = [d.id for d in devices if not d.answering]
    syncing = [d.id for d in devices if d.answering and not d.in_sync]
    synced = len(devices) - len(silent) - len(syncing)
    if single:
        state = "not answering" if silent else "syncing" if syncing else "in sync"
        return f"active for {where}: {state}"
    parts = [count, f"{synced} in sync"]
    if syncing:
        parts.append(f"{len(syncing)} syncing ({_named(syncing)})")
    if silent:
        parts.append(f"{len(silent)} not answering ({_named(silent)})")
    return f"active for {where}: " + ", ".join(parts)


def instance_document(
    *,
    status: str,
    process: str = "",
    line: str,
    instance: str,
    role: str,
    state: str,
    paused: bool,
    ttl_ms: int,
    token: str | None,
    heartbeat_s: float,
    devices: Sequence[DeviceHealth] | Sequence[str],
    summary: str,
    now: float,
    round_trip_s: float | None = None,
    problem: str | None = None,
    duplicates: Sequence[str] = (),
    started_at: float | None = None,
    config_hash: str = "",
    not_ready: str | None = None,
    taking_over_s: float | None = None,
    reconciling: int = 0,
    conflicts: Sequence[dict[str, str]] = (),
    reload_refused: str | None = None,
) -> dict[str, Any]:
    ids = [d if isinstance(d, str) else d.id for d in devices]
    health = [d for d in devices if isinstance(d, DeviceHealth)]
    return {
        "status": status,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "process": process,
        "time": round(now, 3),
        "line": line,
        "instance": instance,
        "role": role,
        "state": state,
        "paused": paused,
        "version": installed(),
        "ttl_ms": ttl_ms,
        "token": token,
        "heartbeat_s": heartbeat_s,
        "devices": ids,
        "in_sync": sum(d.in_sync and d.answering for d in health) if health else None,
        "not_answering": [d.id for d in health if not d.answering],
        "summary": summary,
        "round_trip_ms": None if round_trip_s is None else round(round_trip_s * 1000, 1),
        "problem": problem,
        "duplicates": list(duplicates),
        "started_at": None if started_at is None else round(started_at, 3),
        "config_hash": config_hash,
        "ready": not_ready is None,
        "not_ready": not_ready,
        "taking_over_s": None if taking_over_s is None else round(taking_over_s, 1),
        "reconciling": reconciling,
        "conflicts": list(conflicts),
        "reload_refused": reload_refused,
    }


def will_document(line: str, instance: str) -> dict[str, Any]:
    """What the broker says for an instance whose connection ended without a word."""
    return {
        "status": "down",
        "pid": os.getpid(),
        "line": line,
        "instance": instance,
        "reason": "connection lost",
    }


def encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def _changed(document: dict[str, Any], ignore: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k not in ignore}


# --------------------------------------------------------------------------- what health sees


@dataclass(frozen=True, slots=True)
class DeviceView:
    """One device as the instance has it now."""

    snapshot: Snapshot
    """Its telemetry: the controller's values as last read (active only), last sync."""
    held: bool
    """The active holds its controller (its place on the bus)."""
    synced_value: float | str | bool | None
    synced_version: Hlc | None
    refused: dict[str, str | None] | None = None
    """The last remote value the unit could not take: point, value, reason."""
    served_by: str | None = None
    """Another line that serves the device (configured on both): left alone here."""
    reconciling: bool = False
    """Held since the takeover and not reconciled yet: its store and unit may differ
    for a moment, which is no fault."""


@dataclass(frozen=True, slots=True)
class InstanceView:
    """What health needs of an agent, taken at one moment."""

    role: Role
    paused: bool
    connected: bool
    """The session is connected to the broker."""
    healthy: bool
    """The session, the periodic jobs and the clock watch are running."""
    line_up: bool | None
    """The port is open and usable (None: the line is not open)."""
    token: Hlc | None
    devices: dict[str, DeviceView]
    round_trip_s: float | None = None
    """The longest recent round trip to the store."""
    too_slow: float | None = None
    """The round trip that keeps this instance from holding a lease, while it does."""
    ttl_s: float = 0.0
    taking_over_s: float | None = None
    """Holding the lock, waiting this long still for the previous lease to end."""
    not_ready: str | None = None
    """Why this standby could not take over now (its line checked without touching it)."""
    config_hash: str = ""
    """The line's configuration as this instance runs it (the pair's should agree)."""
    reload_refused: str | None = None
    """Why the last reload was refused, until one loads: the files on disk would fail a
    restart."""
    broker_failure: str | None = None
    """Why the last attempt to connect failed, while not connected."""


# --------------------------------------------------------------------------- the publisher


class Health:
    """Publishes the instance's health, its devices' statuses (while active) and its status
    line, on change and on a heartbeat; answers the HTTP endpoint's questions.

    `view()` is the agent's state now; `session()` the session to publish on (None before
    it exists)."""

    def __init__(
        self,
        settings: AgentSettings,
        view: Callable[[], InstanceView],
        session: Callable[[], Session | None],
        notify_status: Callable[[str], None],
        process: str = "",
    ) -> None:
        self.settings = settings.health
        self.broker = f"{settings.mqtt.host}:{settings.mqtt.port}"
        self.process = process
        self.started = time.time()
        self.duplicates: dict[str, str] = {}
        """Other processes heard on this instance's own topic: process -> where."""
        self.ttl_ms = settings.lock.ttl_ms
        self.line = settings.line
        self.instance = settings.instance_id
        self.topic = settings.health.instance_topic(self.line.id, self.instance)
        self._view = view
        self._session = session
        self._notify_status = notify_status
        self._store: dict[str, tuple[bytes | None, Hlc | None]] = {}
        self._wake = asyncio.Event()
        self._last_instance: tuple[dict[str, Any], float] | None = None
        self._last_device: dict[str, tuple[dict[str, Any], float]] = {}
        self._last_availability: dict[str, bytes] = {}
        self._last_shown: dict[str, tuple[object, ...]] = {}
        """What each device's document said last was built from (see _publish_device)."""
        self._device_health: dict[str, tuple[tuple[object, ...], DeviceHealth]] = {}
        self._last_words: str | None = None
        self._failing_since: tuple[str, float] | None = None
        self._stopped = False

    # ------------------------------------------------------------------ inputs

    def will(self) -> Message:
        """The Last Will for the session: this instance's health, down, retained."""
        return Message(
            self.topic,
            encode(will_document(self.line.id, self.instance)),
            qos=1,
            retain=True,
            content_type=CONTENT_TYPE,
        )

    def store_seen(self, device: str, value: bytes | None, version: Hlc | None) -> None:
        """The set point key of `device` holds `value` (a notification, a read): said at the
        next tick, not at once. A remote change is on the unit a transaction or two later;
        woken now, health would say the device out of sync for that moment and in sync
        again (two instance documents, a status line and their answers a change)."""
        self._store[device] = (value, version)

    def store_value(self, device: DeviceView) -> bytes | None:
        """The set point in the store as far as this instance knows: what it saw, or what
        it wrote itself since (its sync record's version is newer)."""
        value, version = self._store.get(device.snapshot.device, (None, None))
        synced_value, synced_version = device.synced_value, device.synced_version
        if (
            isinstance(synced_value, float)
            and synced_version is not None
            and (version is None or synced_version > version)
        ):
            return decisions.encode_setpoint(synced_value)
        return value

    def heard(self, message: Message) -> None:
        """A message on this instance's own health topic. Another process saying it is up
        there, since this one started, runs with the same instance id: said once, by each
        of the two (each hears the other's heartbeats)."""
        try:
            document = json.loads(message.payload)
        except (ValueError, UnicodeDecodeError):
            return
        if not isinstance(document, dict) or document.get("status") != "up":
            return
        other = document.get("process")
        sent = document.get("time")
        if not isinstance(other, str) or other in ("", self.process) or other in self.duplicates:
            return
        if not isinstance(sent, int | float) or sent < self.started:
            return  # a retained message of an earlier process of this instance
        where = f"host {document.get('host', '?')}, pid {document.get('pid', '?')}"
        self.duplicates[other] = where
        log.error(
            "another process runs with instance id %s on line %s (%s): instance ids must be "
            "unique within a pair (a cloned gateway? set AGENT_INSTANCE_ID)",
            self.instance,
            self.line.id,
            where,
        )
        self._wake.set()

    def poke(self) -> None:
        """Something changed (role, pause, the line): publish now what is due."""
        self._wake.set()

    def reconnected(self) -> None:
        """After a reconnect, the broker published our will: say everything again."""
        self._last_instance = None
        self._last_device.clear()
        self._last_availability.clear()
        self._wake.set()

    # ------------------------------------------------------------------ state

    @staticmethod
    def role(view: InstanceView) -> str:
        role = view.role
        return role.value if role in (Role.ACTIVE, Role.STANDBY, Role.STOPPING) else "starting"

    def failing(self, view: InstanceView) -> str | None:
        """Why this instance cannot do its part now, or None."""
        if not view.connected:
            return f"not connected to the broker {self.broker}"
        if not view.healthy:
            return "a job of the agent stopped"
        if view.role is Role.ACTIVE and view.line_up is False:
            return "the line is down"
        if view.too_slow is not None:
            return (
                f"the round trip to the store ({view.too_slow * 1000:.0f} ms) is too long to "
                f"hold a lease of {view.ttl_s * 1000:.0f} ms: this instance cannot take over"
            )
        if view.role is not Role.ACTIVE and view.not_ready is not None:
            return f"cannot take over: {view.not_ready}"
        elsewhere = sorted(
            f"{name} (line {d.served_by})"
            for name, d in view.devices.items()
            if d.served_by is not None
        )
        if elsewhere:
            return f"served by another line too, left alone here: {', '.join(elsewhere)}"
        return None

    def state(self, view: InstanceView) -> str:
        return "failing" if self.failing(view) else "paused" if view.paused else "running"

    def devices(self, view: InstanceView) -> list[DeviceHealth]:
        found = []
        for name, device in view.devices.items():
            shown = (device, self._store.get(name))
            known = self._device_health.get(name)
            if known is None or known[0] != shown:
                answering = device.held and device.snapshot.controller == "ok"
                value = device.snapshot.setpoint  # the controller's, as last read
                health = DeviceHealth(name, answering, in_sync(self.store_value(device), value))
                known = self._device_health[name] = (shown, health)
            found.append(known[1])
        if len(self._device_health) > len(found):  # a reload removed devices
            self._device_health = {d.id: self._device_health[d.id] for d in found}
        return found

    def words(self, view: InstanceView | None = None) -> str:
        view = view or self._view()
        role = self.role(view)
        if role == "starting":
            if view.connected:
                return "starting"
            failure = view.broker_failure
            why = None if failure is None else "not connected"
            return f"connecting to the broker {self.broker}" + self._failing_words(why, failure)
        words = status_words(
            role,
            self.line.id,
            single=self.line.single,
            devices=self.devices(view),
            paused=view.paused,
        )
        return words + self._failing_words(self.failing(view))

    def _failing_words(self, why: str | None, shown: str | None = None) -> str:
        """What is wrong and since when, for the unit's status line (systemctl status): since
        `why` began; `shown` says it in more words (the last attempt's failure, say)."""
        if why is None:
            self._failing_since = None
            return ""
        if self._failing_since is None or self._failing_since[0] != why:
            self._failing_since = (why, time.time())
        since = time.strftime("%H:%M:%S UTC", time.gmtime(self._failing_since[1]))
        return f"; failing since {since}: {shown or why}"

    def instance_document(
        self, status: str = "up", view: InstanceView | None = None
    ) -> dict[str, Any]:
        view = view or self._view()
        token = view.token
        active = view.role is Role.ACTIVE
        return instance_document(
            status=status,
            process=self.process,
            line=self.line.id,
            instance=self.instance,
            role=self.role(view),
            state=self.state(view),
            paused=view.paused,
            ttl_ms=self.ttl_ms,
            token=str(token) if token is not None else None,
            heartbeat_s=self.settings.interval_s,
            devices=self.devices(view) if active else list(view.devices),
            summary=self.words(view),
            now=time.time(),
            round_trip_s=view.round_trip_s,
            problem=self.failing(view),
            duplicates=[f"{p} ({where})" for p, where in self.duplicates.items()],
            started_at=self.started,
            config_hash=view.config_hash,
            reload_refused=view.reload_refused,
            not_ready=view.not_ready if view.role is not Role.ACTIVE else None,
            taking_over_s=view.taking_over_s,
            reconciling=sum(d.reconciling for d in view.devices.values()) if active else 0,
            conflicts=[
                {"device": name, "line": d.served_by}
                for name, d in view.devices.items()
                if d.served_by is not None
            ],
        )

    def device_document(self, view: InstanceView, device: str) -> tuple[dict[str, Any], bytes]:
        """A device's status and availability, as the active sees it."""
        seen = view.devices[device]
        snapshot = seen.snapshot
        paused = view.paused
        answering = seen.held and snapshot.controller == "ok"
        store = self.store_value(seen)
        available = answering and not paused
        document = {
            "device": device,
            "line": self.line.id,
            "instance": self.instance,
            "time": round(time.time(), 3),
            "availability": "online" if available else "offline",
            "controller": "paused" if paused else snapshot.controller or "unavailable",
            "store": None if store is None else store.decode(errors="replace"),
            "setpoint": snapshot.setpoint,
            "temperature": snapshot.temperature,
            # Not while reconciling (taken over, fenced or not yet): its unit is unread.
            "in_sync": available and not seen.reconciling and in_sync(store, snapshot.setpoint),
            "last_sync": snapshot.last_sync_time,
            "last_sync_version": snapshot.last_sync_version,
            "errors": snapshot.errors,
            "points": snapshot.points,
            "changes": snapshot.changes,
            "slow_ms": snapshot.slow_ms,
            "refused": seen.refused,
            "reconciling": seen.reconciling,
            "served_by": seen.served_by,
        }
        return document, ONLINE if available else OFFLINE

    # ------------------------------------------------------------------ publishing

    async def run(self) -> None:
        """Publishes what is due, on every change and every tick, until cancelled."""
        while True:
            try:
                await self.publish_due()
            except Exception:
                log.exception("health not published; trying again")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self._wake.wait()
            self._wake.clear()

    async def publish_due(self) -> None:
        if self._stopped:
            return
        view = self._view()
        words = self.words(view)
        if words != self._last_words:
            self._last_words = words
            self._notify_status(words)
        session = self._session()
        if session is None or not session.connected:
            return
        now = time.monotonic()
        document = self.instance_document(view=view)
        key = _changed(document, ("time", "token", "pid", "version", "round_trip_ms"))
        last = self._last_instance
        due = last is None or last[0] != key or now - last[1] >= self.settings.interval_s
        if due and await self._publish(session, self.topic, encode(document)):
            self._last_instance = (key, now)
        if view.role is Role.ACTIVE:
            await asyncio.gather(
                *(
                    self._publish_device(session, view, d, now)
                    for d in view.devices
                    if not self._said(view, d, now)
                )
            )
        else:
            self._last_device.clear()  # a new active says it all again
            self._last_availability.clear()

    def _said(self, view: InstanceView, device: str, now: float) -> bool:
        """The device's document would be built from what it was built from when last said
        (the agent hands out the same device view while nothing it shows changed), and its
        heartbeat is not due: it is not built at all."""
        last = self._last_device.get(device)
        return (
            last is not None
            and self._last_shown.get(device) == self._shown(view, device)
            and now - last[1] < self.settings.interval_s
        )

    def _shown(self, view: InstanceView, device: str) -> tuple[object, ...]:
        return (view.devices[device], view.paused, self._store.get(device))

    async def _publish_device(
        self, session: Session, view: InstanceView, device: str, now: float
    ) -> None:
        shown = self._shown(view, device)
        last = self._last_device.get(device)
        document, availability = self.device_document(view, device)
        line = self.line.id
        topic = self.settings.device_availability_topic(device, line)
        if self._last_availability.get(device) != availability and await self._publish(
            session, topic, availability, content_type="text/plain"
        ):
            self._last_availability[device] = availability
        key = _changed(document, ("time", "temperature", "points"))
        # A device going offline or paused is said at once; its values at most once a
        # second; all of it every interval.
        due = (
            last is None
            or any(last[0].get(k) != key.get(k) for k in ("availability", "controller"))
            or (last[0] != key and now - last[1] >= DEVICE_MIN_INTERVAL_S)
            or now - last[1] >= self.settings.interval_s
        )
        topic = self.settings.device_status_topic(device, line)
        if due and await self._publish(session, topic, encode(document)):
            self._last_device[device] = last = (key, now)
        said = last is not None and last[0] == key
        if said and self._last_availability.get(device) == availability:
            self._last_shown[device] = shown

    async def _publish(
        self, session: Session, topic: str, payload: bytes, *, content_type: str = CONTENT_TYPE
    ) -> bool:
        try:
            await session.publish(
                topic,
                payload,
                qos=1,
                retain=True,
                content_type=content_type,
                timeout=PUBLISH_TIMEOUT_S,
            )
        except SessionError as exc:
            log.debug("health: %s not published: %s", topic, exc)
            return False
        return True

    async def going_offline(self) -> None:
        """The active is stopping: its devices are offline until the next active says
        otherwise. QoS 0, sent at once: before the lock's release, and so before anything
        the next active publishes."""
        session = self._session()
        if session is None or not session.connected:
            return
        for device in self._view().devices:
            topic = self.settings.device_availability_topic(device, self.line.id)
            with contextlib.suppress(SessionError):
                await session.publish(topic, OFFLINE, qos=0, retain=True)

    async def stopped(self) -> None:
        """A clean stop: says "down" itself (the will is for the unclean ones)."""
        self._stopped = True
        session = self._session()
        if session is None or not session.connected:
            return
        document = self.instance_document(status="down")
        document["reason"] = "stopped"
        await self._publish(session, self.topic, encode(document))
