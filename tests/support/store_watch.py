"""Every write the embedded store handles, in its own order: a hook on the pure store."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from agent.emulator.store import StateStore
from agent.protocol.resp3 import decode_request
from tests.soak.checker import StoreEvent

WRITES = ("SET", "DEL", "VDEL")
ACCEPTED = (b"+OK\r\n", b":1\r\n")


def watch_writes(
    store: StateStore,
    record: Callable[[StoreEvent], None],
    read: Callable[[str, bytes], None] | None = None,
) -> None:
    """Calls `record` with each SET, DEL and VDEL the store handles (accepted or not), and
    `read(client, key)` with each GET, as it handles them. Call from the store's event loop."""
    handle = store.handle

    def watched(client: str, payload: bytes, ts: Any, token: Any) -> Any:
        outcome = handle(client, payload, ts, token)
        try:
            args = decode_request(payload)
        except Exception:
            return outcome
        if len(args) < 2:
            return outcome
        command = args[0].upper().decode(errors="replace")
        if command == "GET" and read is not None:
            read(client, args[1])
        if command in WRITES:
            reply = outcome.reply
            upper = [arg.upper() for arg in args]
            expiry = None
            if b"PX" in upper[3:]:
                with contextlib.suppress(ValueError, IndexError):
                    expiry = int(args[upper.index(b"PX", 3) + 1])
            record(
                StoreEvent(
                    at=time.monotonic(),
                    client=client,
                    command=command,
                    key=args[1],
                    value=args[2] if command == "SET" and len(args) > 2 else None,
                    token=token,
                    accepted=reply.payload in ACCEPTED,
                    version=None if reply.timestamp is None else str(reply.timestamp),
                    expiry_ms=expiry,
                )
            )
        return outcome

    store.handle = watched  # type: ignore[method-assign]
