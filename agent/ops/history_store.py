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

    async def record(self, token: Hlc | None, entry: Entry) -> bool:
        """Appends `entry`, fenced with `token` (None: not recorded, nothing to fence
        with); whether it was written."""
        if token is None:
            return False
        async with self._one_at_a_time:
            try:
                raw, _ = await self.client.get(self.key)
                await self.client.set(self.key, append(raw, entry), fencing_token=token)
            except FencingTokenLowerVersion:
                log.debug("%s not recorded in %s: a newer active wrote it", entry.event, self.key)
                return False
            except (StateStoreError, SessionError, OSError) as exc:
                level = logging.DEBUG if self._failed_before else logging.WARNING
                self._failed_before = True
                log.log(
                    level,
                    "could not record the %s in the line's history %s: %s (agent history "
                    "misses it; the line is served all the same, and this is said only once)",
                    entry.event,
                    self.key,
                    exc,
                )
                return False
        return True
