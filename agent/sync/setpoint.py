"""The set point sync loop: reads the controller and the store, asks `decisions`, and
carries out the answer. One operation at a time, so that decisions see a settled state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.client.errors import FencingTokenLowerVersion, StateStoreError
from agent.client.lock import LeasedLock, LockNotHeld
from agent.client.session import SessionError
from agent.client.statestore import KeyChange, StateStoreClient
from agent.controller.base import BlockingPortDriver, WriteNotAllowed
from agent.controller.interface import (
    ControllerError,
    ControllerFault,
    ControllerUnavailable,
    Limits,
)
from agent.protocol.hlc import Hlc
from agent.sync import decisions
from agent.sync.decisions import (
    ApplyToController,
    Decision,
    Ignore,
    PublishToStore,
    Record,
    Reject,
    Synced,
)
from agent.sync.state_file import StateFile


@dataclass
class SyncCounters:
    invalid_remote_values: int = 0
    controller_errors: int = 0
    store_errors: int = 0
    fenced_writes_rejected: int = 0


@dataclass
class SyncStatus:
    synced: Synced = field(default_factory=Synced)
    synced_at: float | None = None  # wall clock, seconds
    controller: str = "ok"  # ok | unavailable | error
    counters: SyncCounters = field(default_factory=SyncCounters)


class SetpointSync:
    """Moves the set point between one controller and one key, as the lock's holder."""

    def __init__(
        self,
        controller: BlockingPortDriver,
        client: StateStoreClient,
        lock: LeasedLock,
        key: str,
        state_file: StateFile,
        status: SyncStatus,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
        may_write: Callable[[], bool],
    ) -> None:
        self.controller = controller
        self.client = client
        self.lock = lock
        self.key = key
        self.state_file = state_file
        self.status = status
        self.log = log
        self._may_write = may_write
        self._busy = asyncio.Lock()

    # ------------------------------------------------------------------ events

    async def on_remote_change(self, change: KeyChange) -> None:
        value, version = change.value, change.version
        if value is None or version is None:
            # A delete, or a change found without its version: compare the three anew
            # (a deleted key gets the controller's value back).
            if change.kind == "DELETE":
                self.log.info("set point key deleted in the store: publishing it again")
            await self.reconcile()
            return
        await self._run(
            "remote change",
            lambda controller: decisions.on_remote_change(
                self.status.synced, value, version, controller, self._limits()
            ),
        )

    async def poll(self) -> None:
        await self._run("poll", lambda c: decisions.on_poll(self.status.synced, c))

    async def reconcile(self) -> None:
        try:
            raw, version = await self.client.get(self.key)
        except (StateStoreError, SessionError) as exc:
            self.status.counters.store_errors += 1
            self.log.warning("reconcile: cannot read %s: %s", self.key, exc)
            return
        await self._run(
            "reconcile",
            lambda c: decisions.reconcile(self.status.synced, raw, version, c, self._limits()),
        )

    async def quiesce(self, timeout: float) -> None:
        """Waits for the operation in progress and lets no other start."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._busy.acquire()

    # ------------------------------------------------------------------ carrying out

    def _limits(self) -> Limits:
        limits = self.controller.limits
        assert limits is not None
        return limits

    async def _run(self, what: str, decide: Callable[[float], Decision]) -> None:
        async with self._busy:
            if not self._may_write():
                return
            try:
                # The whole state in one exchange: telemetry reports it too.
                controller_value = (await self.controller.read_state()).setpoint
                if self.controller.limits is None:
                    await self.controller.read_limits()
            except ControllerFault as exc:
                self._controller_fault(exc)
                self.log.debug("%s: controller not readable: %s", what, exc)
                return
            self.status.controller = "ok"
            decision = decide(controller_value)
            await self._carry_out(what, decision)

    async def _carry_out(self, what: str, decision: Decision) -> None:
        if isinstance(decision, Ignore):
            self.log.debug("%s: %s", what, decision.reason)
        elif isinstance(decision, Reject):
            self.status.counters.invalid_remote_values += 1
            self.log.warning(
                "%s: invalid set point in the store ignored: %s", what, decision.reason
            )
        elif isinstance(decision, Record):
            self._record(decision.value, decision.version)
        elif isinstance(decision, PublishToStore):
            await self._publish(decision.value, decision.reason)
        elif isinstance(decision, ApplyToController):
            await self._apply(decision)

    async def _apply(self, decision: ApplyToController) -> None:
        try:
            readback = await self.controller.write_setpoint(decision.value, allowed=self._may_write)
        except WriteNotAllowed:
            self.log.info("write of %s withdrawn: no longer active", decision.value)
            return
        except ControllerFault as exc:
            self._controller_fault(exc)
            self.log.warning("could not apply set point %s: %s", decision.value, exc)
            return
        self.log.info(
            "applied remote set point %s to the controller (version %s)",
            readback,
            decision.version,
        )
        self._record(readback, decision.version)
        if decision.correct_store or not decisions.same(readback, decision.value):
            await self._publish(readback, "the controller keeps a rounded value")

    async def _publish(self, value: float, reason: str) -> None:
        if not self._may_write():
            return
        try:
            result = await self.lock.fenced_set(self.key, decisions.encode_setpoint(value))
        except FencingTokenLowerVersion:
            self.status.counters.fenced_writes_rejected += 1
            self.log.warning("store refused our write of %s: a newer active wrote", value)
            return
        except LockNotHeld:
            return
        except (StateStoreError, SessionError) as exc:
            self.status.counters.store_errors += 1
            self.log.warning("could not write set point %s to the store: %s", value, exc)
            return
        self.log.info(
            "published set point %s to the store (%s, version %s)", value, reason, result.version
        )
        self._record(value, result.version)

    def _controller_fault(self, exc: ControllerFault) -> None:
        if isinstance(exc, ControllerUnavailable):
            self.status.controller = "unavailable"
        elif isinstance(exc, ControllerError):
            self.status.controller = "error"
        self.status.counters.controller_errors += 1

    def _record(self, value: float, version: Hlc | None) -> None:
        synced = Synced(value, version)
        if synced == self.status.synced:
            return
        self.status.synced = synced
        self.status.synced_at = time.time()
        try:
            self.state_file.save(synced)
        except OSError as exc:
            self.log.warning("could not save the synced state: %s", exc)
