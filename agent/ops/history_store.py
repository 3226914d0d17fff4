"""A line's history in the store (`<line>\\history`, agent.ops.history): read by `agent
history`, written by the line's active.

The writer is best effort: a record is read, appended to and written back fenced with the
writer's lease (a former active's late record cannot overwrite a newer active's), one at a
time. A record that cannot be written is logged (the first failure as a warning, the rest at
debug) and never raises: the history is for the operator, the line comes first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from agent.client.errors import FencingTokenLowerVersion, StateStoreError
from agent.client.session import SessionError
from agent.client.statestore import StateStoreClient
from agent.ops.history import Entry, append, parse
from agent.protocol.hlc import Hlc

log = logging.getLogger("agent")


async def read(client: StateStoreClient, key: str) -> list[Entry] | None:
    """The history in `key` (None: none recorded); InvalidHistory if it is not one."""
    raw, _ = await client.get(key)
    return None if raw is None else parse(raw)


class HistoryWriter:
    def __init__(self, client: StateStoreClient, key: str) -> None:
        self.client = client
        self.key = key
        self._one_at_a_time = asyncio.Lock()
        self._failed_before = False

    async def record(
        self, token: Hlc | None, *entries: Entry, leased: Callable[[], bool] = lambda: True
    ) -> bool:
        """Appends `entries`, fenced with `token` (None: not recorded, nothing to fence
        with), if `leased()` still says the lease of `token` is held when it is written
        (no write after the lease, even to the history); whether they were written."""
        if token is None or not entries:
            return False
        event = entries[-1].event
        async with self._one_at_a_time:
            try:
                raw, _ = await self.client.get(self.key)
                if not leased():
                    log.debug("%s not recorded in %s: the lease ended", event, self.key)
                    return False
                for entry in entries:
                    raw = append(raw, entry)
                await self.client.set(self.key, raw, fencing_token=token)
            except FencingTokenLowerVersion:
                log.debug("%s not recorded in %s: a newer active wrote it", event, self.key)
                return False
            except (StateStoreError, SessionError, OSError) as exc:
                level = logging.DEBUG if self._failed_before else logging.WARNING
                self._failed_before = True
                log.log(
                    level,
                    "could not record the %s in the line's history %s: %s (agent history "
                    "misses it; the line is served all the same, and this is said only once)",
                    event,
                    self.key,
                    exc,
                )
                return False
        return True
