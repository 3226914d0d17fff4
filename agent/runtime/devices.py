"""The line's devices as an instance keeps them: each one's sync made from the settings,
and its keys watched in the store. Used at start and when a reload adds a device."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from agent.backoff import Backoff
from agent.client.errors import NotAuthorized, StateStoreError
from agent.client.lock import LeasedLock
from agent.client.session import Session, SessionError
from agent.client.statestore import KeyChange, StateStoreClient
from agent.protocol.hlc import Hlc
from agent.runtime.line import device_profile
from agent.sync.device import DeviceKeys, DeviceSync
from agent.sync.state_file import LaterSaves, StateFile

if TYPE_CHECKING:
    from agent.config import AgentSettings, MqttSettings
    from agent.config.devices import DeviceSettings

log = logging.getLogger("agent")

PointHandler = Callable[[str, str, KeyChange], Awaitable[None]]
RecordHandler = Callable[[str, KeyChange], Awaitable[None]]
StoreSeen = Callable[[str, bytes | None, Hlc | None], None]


def make_sync(
    settings: AgentSettings,
    device: DeviceSettings,
    client: StateStoreClient,
    lock: LeasedLock,
    may_write: Callable[[], bool],
    later: LaterSaves | None = None,
) -> DeviceSync:
    """`later`: where the devices' syncs wait to be saved (agent.sync.state_file)."""
    s = settings
    profile = device_profile(s, device)
    return DeviceSync(
        device.id,
        client,
        lock,
        DeviceKeys(
            setpoint=s.key("setpoint", device.id),
            record=s.key("synced", device.id),
            line=s.key("line", device.id),
            line_id=s.line.id,
            points={name: s.point_key(name, device.id) for name in profile.points},
            lock_of_line=functools.partial(s.keys.of_line, "lock"),
        ),
        StateFile(s.state_dir, device.id, later=later),
        logging.LoggerAdapter(log, {"device": device.id}),
        may_write,
        profile,
        profile.after_absence or s.serial.after_absence,
    )


async def watch_device(
    client: StateStoreClient,
    device_id: str,
    sync: DeviceSync,
    *,
    on_point: PointHandler,
    on_record: RecordHandler,
    store_seen: StoreSeen,
) -> tuple[bool, bytes | None]:
    """Watches a device's points and its sync record, all at once: whether it can be
    served, and its record. A device whose set point the broker's rules do not let this
    agent read cannot (said once); a point other than the set point that the rules refuse
    is left out of the device's sync."""
    points = list(sync.points)
    watched = await asyncio.gather(
        *(
            client.observe(sync.keys.of(p), functools.partial(on_point, device_id, p))
            for p in points
        ),
        client.observe(sync.keys.record, functools.partial(on_record, device_id)),
        return_exceptions=True,
    )
    failed = [r for r in watched if isinstance(r, BaseException) and not _refused(r)]
    if failed:
        raise failed[0]  # the caller watches the device again
    *of_points, of_record = watched
    for point, result in zip(points, of_points, strict=True):
        if isinstance(result, BaseException):
            await _unobserve(client, sync.keys.of(point))
            if point == "setPoint":
                await unwatch_device(client, sync)
                log.error(
                    "device %s is not served: the store refuses to let this agent read %s "
                    "(not authorized by the broker's rules)",
                    device_id,
                    sync.keys.of(point),
                    extra={"device": device_id},
                )
                return False, None
            del sync.points[point]
            log.error(
                "%s of device %s is not kept in sync: the store refuses to let this "
                "agent read %s (not authorized by the broker's rules)",
                point,
                device_id,
                sync.keys.of(point),
                extra={"device": device_id},
            )
            continue
        value, version = result
        sync.saw_in_store(point, value, version)
        sync.follow_value(point, value, version)
        if point == "setPoint":
            store_seen(device_id, value, version)
    if isinstance(of_record, BaseException):
        await _unobserve(client, sync.keys.record)
        sync.status.counters.not_authorized += 1
        log.error(
            "the store refuses to let this agent read %s (not authorized by the broker's "
            "rules): a takeover knows less of what the former active synced",
            sync.keys.record,
            extra={"device": device_id},
        )
        return True, None
    record, _ = of_record
    await sync.follow_record(record)
    return True, record


def _refused(error: BaseException) -> bool:
    return isinstance(error, NotAuthorized)


async def _unobserve(client: StateStoreClient, key: str) -> None:
    with contextlib.suppress(StateStoreError, SessionError):
        await client.unobserve(key)


def store_retry(mqtt: MqttSettings) -> Backoff:
    """The delays of a start's tries while the service does not answer (each capped by
    its caller, see watch_devices)."""
    return Backoff(min(mqtt.reconnect_min_s, mqtt.reconnect_max_s), mqtt.reconnect_max_s)


async def watch_devices(
    devices: dict[str, DeviceSync],
    watch: Callable[[str, DeviceSync], Awaitable[tuple[bool, bytes | None]]],
    *,
    retry: Backoff,
    within_s: float,
    record_found: Callable[[], None],
    session: Session,
) -> None:
    """Every device's keys at once (`watch`, which says whether the device can be served and
    returns its record; one that cannot is left out of `devices`), each device again while the
    service does not answer, within `within_s` of each failure, and at once when the
    `session`'s link comes back; `record_found()` for each sync record."""
    started = time.monotonic()
    waiting = dict(devices)
    while waiting:
        watched = await asyncio.gather(
            *(watch(name, sync) for name, sync in waiting.items()), return_exceptions=True
        )
        for name, result in zip(list(waiting), watched, strict=True):
            if isinstance(result, (StateStoreError, SessionError)):
                continue
            if isinstance(result, BaseException):
                raise result
            del waiting[name]
            served, record = result
            if not served:
                del devices[name]
            if record is not None:
                record_found()
        if waiting:
            # Said once: while the link is down every try fails at once.
            said = log.warning if retry.attempts == 0 else log.debug
            delay = retry.next_delay(ceiling=within_s)
            down = not session.connected
            said(
                "state store not answering yet: %d device(s) not watched yet; trying again "
                "in %.2f s%s",
                len(waiting),
                delay,
                " or once the link is back" if down else "",
            )
            if down:
                # A try while the link is down fails at once; the one that counts is the
                # first after it is back (a standby cut off during its start, whose peer
                # may be gone, takes over only once its devices are watched).
                with contextlib.suppress(SessionError):  # SessionTimeout: the delay passed
                    await session.wait_connected(timeout=delay)
            else:
                await asyncio.sleep(delay)
    log.info(
        "watching %d device(s) in the store (%.0f ms)",
        len(devices),
        (time.monotonic() - started) * 1000,
    )


async def unwatch_device(client: StateStoreClient, sync: DeviceSync) -> None:
    """Stops the notifications of a device that left the line (a reload)."""
    for key in [sync.keys.of(point) for point in sync.points] + [sync.keys.record]:
        await _unobserve(client, key)
