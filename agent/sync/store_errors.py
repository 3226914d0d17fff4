"""What a point says of the store's errors: each one counted and logged; a refusal by the
broker's rules said once per key (again only after the key was allowed in between), naming
the key and what the refusal costs, so that an operator can fix the rules."""

from __future__ import annotations

import logging

from agent.client.errors import NotAuthorized
from agent.sync.status import SyncCounters

WHAT_A_REFUSAL_COSTS = {
    "write": "changes made at the controller are not published",
    "read": "the device is not kept in sync",
    "write the sync record to": "a takeover knows less of what this instance synced",
    "write the line's name to": "remote writers cannot find the device's line",
}


class StoreErrors:
    def __init__(
        self,
        counters: SyncCounters,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.counters = counters
        self.log = log
        self._refused: set[str] = set()  # keys the broker's rules refuse us, said once

    def failed(self, exc: Exception, key: str, doing: str) -> None:
        """`doing` (one of WHAT_A_REFUSAL_COSTS) `key` failed with `exc`."""
        if isinstance(exc, NotAuthorized):
            self.counters.not_authorized += 1
            if key not in self._refused:
                self._refused.add(key)
                self.log.error(
                    "the store refuses to let this agent %s %s (not authorized by the "
                    "broker's rules): %s",
                    doing,
                    key,
                    WHAT_A_REFUSAL_COSTS.get(doing, "this is skipped"),
                )
            return
        self.counters.store_errors += 1
        self.log.warning("could not %s %s: %s", doing, key, exc)

    def allowed(self, key: str) -> None:
        """A request on `key` succeeded: a refusal said before is over."""
        if key in self._refused:
            self._refused.discard(key)
            self.log.info("the store lets this agent use %s again", key)
