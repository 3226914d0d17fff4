"""The operator's requests as an instance follows them: pause and switchover.

Both instances of a pair watch the line's `paused` and `switchover` keys (agent.ops.control
holds their format), so that a pause survives a failover and a restart, and a switchover
reaches whoever is active:

- **Paused** while `<line>\\paused` exists: the active keeps the lock (the standby does not
  take over) but closes the line and writes nothing; on resume it reconciles every device.
  An instance that becomes active on a paused line leaves the line closed.
- **Switchover**: a request naming this process's hold on the lock makes it hand over (the
  agent's `on_switchover`): it stops driving, releases the lock, and stands aside for a
  grace period, so that a standby takes the lock on its DELETE. A standby holds off while
  a request names another instance, for the same grace period at most. If nobody takes
  the lock within it, the former active contends again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from agent.client.statestore import KeyChange, StateStoreClient
from agent.ops.control import InvalidRequest, PauseNote, SwitchoverRequest

log = logging.getLogger("agent")


class LineControl:
    def __init__(
        self,
        client: StateStoreClient,
        *,
        paused_key: str,
        switchover_key: str,
        instance_id: str,
        holder: bytes,
        grace_s: float,
        on_pause: Callable[[], None],
        on_switchover: Callable[[SwitchoverRequest], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.paused_key = paused_key
        self.switchover_key = switchover_key
        self.instance_id = instance_id
        self.holder = holder.decode()
        self.grace_s = grace_s
        self._on_pause = on_pause
        self._on_switchover = on_switchover
        self._monotonic = monotonic
        self.pause: PauseNote | None = None
        self.request: SwitchoverRequest | None = None
        self._request_seen_at = 0.0
        self._aside_until = 0.0

    @property
    def paused(self) -> bool:
        return self.pause is not None

    async def watch(self) -> None:
        """Watches both keys and takes their current values (at start, and again after a
        reconnect: changes missed meanwhile come as synthetic changes)."""
        (paused, _), (switchover, _) = await asyncio.gather(
            self.client.observe(self.paused_key, self._paused_changed),
            self.client.observe(self.switchover_key, self._switchover_changed),
        )
        self._set_pause(paused)
        self._set_request(switchover, act=False)  # one made before this process: not about it

    # ------------------------------------------------------------------ pause

    def _paused_changed(self, change: KeyChange) -> None:
        was = self.pause
        self._set_pause(change.value)
        if (was is None) != (self.pause is None):
            self._on_pause()

    def _set_pause(self, value: bytes | None) -> None:
        self.pause = None if value is None else PauseNote.parse(value)

    # ------------------------------------------------------------------ switchover

    def _switchover_changed(self, change: KeyChange) -> None:
        self._set_request(change.value, act=True)

    def _set_request(self, value: bytes | None, *, act: bool) -> None:
        if value is None:
            self.request = None
            self._aside_until = 0.0  # given up, or done: contend as usual again
            return
        try:
            request = SwitchoverRequest.parse(value)
        except InvalidRequest as exc:
            log.warning("ignoring the switchover request in %s: %s", self.switchover_key, exc)
            return
        self.request = request
        self._request_seen_at = self._monotonic()
        if act and request.holder == self.holder:
            self._on_switchover(request)

    def stand_aside(self) -> None:
        """Handing over: do not contend for the grace period (or until the request is
        withdrawn)."""
        self._aside_until = self._monotonic() + self.grace_s

    def hold_off(self) -> bool:
        """Whether this instance leaves the lock to another for now."""
        now = self._monotonic()
        if now < self._aside_until:
            return True
        request = self.request
        return (
            request is not None
            and request.to is not None
            and request.to != self.instance_id
            and now < self._request_seen_at + self.grace_s
        )
