"""The line's devices as an instance keeps them: each one's sync made from the settings,
and its keys watched in the store. Used at start and when a reload adds a device."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable

from agent.client.errors import NotAuthorized, StateStoreError
from agent.client.lock import LeasedLock
from agent.client.session import SessionError
from agent.client.statestore import KeyChange, StateStoreClient
from agent.config import AgentSettings
from agent.config.devices import DeviceSettings
from agent.protocol.hlc import Hlc
from agent.runtime.line import device_profile
from agent.sync.device import DeviceKeys, DeviceSync
from agent.sync.state_file import StateFile

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
) -> DeviceSync:
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
        StateFile(s.state_dir, device.id),
        logging.LoggerAdapter(log, {"device": device.id}),
        may_write,
        profile,
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
    """Watches a device's points and its sync record: whether it can be served, and its
    record. A device whose set point the broker's rules do not let this agent read cannot
    (said once); a point other than the set point that the rules refuse is left out of
    the device's sync."""
    for point in list(sync.points):
        key = sync.keys.of(point)
        try:
            value, version = await client.observe(
                key, functools.partial(on_point, device_id, point)
            )
        except NotAuthorized:
            with contextlib.suppress(StateStoreError, SessionError):
                await client.unobserve(key)
            if point != "setPoint":
                del sync.points[point]
                log.error(
                    "%s of device %s is not kept in sync: the store refuses to let this "
                    "agent read %s (not authorized by the broker's rules)",
                    point,
                    device_id,
                    key,
                    extra={"device": device_id},
                )
                continue
            log.error(
                "device %s is not served: the store refuses to let this agent read %s "
                "(not authorized by the broker's rules)",
                device_id,
                key,
                extra={"device": device_id},
            )
            return False, None
        sync.saw_in_store(point, value, version)
        sync.follow_value(point, value, version)
        if point == "setPoint":
            store_seen(device_id, value, version)
    try:
        record, _ = await client.observe(sync.keys.record, functools.partial(on_record, device_id))
    except NotAuthorized:
        with contextlib.suppress(StateStoreError, SessionError):
            await client.unobserve(sync.keys.record)
        sync.status.counters.not_authorized += 1
        log.error(
            "the store refuses to let this agent read %s (not authorized by the broker's "
            "rules): a takeover knows less of what the former active synced",
            sync.keys.record,
            extra={"device": device_id},
        )
        return True, None
    await sync.follow_record(record)
    return True, record


async def unwatch_device(client: StateStoreClient, sync: DeviceSync) -> None:
    """Stops the notifications of a device that left the line (a reload)."""
    for key in [sync.keys.of(point) for point in sync.points] + [sync.keys.record]:
        with contextlib.suppress(StateStoreError, SessionError):
            await client.unobserve(key)
