"""What waits to be written to one client of the embedded broker, in order.

Small packets produced in one turn of the event loop go out in one write. A big payload is
written from the one bytes object every client it goes to shares (a notification to all the
watchers of a key, a PUBLISH to all its subscribers): each connection writes its own head
(topic, packet id), then that payload in chunks, only as fast as its socket takes them (the
transport's flow control). A client that reads nothing holds a reference to the payload,
not a copy of it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

SHARED_FROM: Final = 64 * 1024  # payloads from this size are written from the shared object
_CHUNK: Final = 64 * 1024  # the most of a shared payload handed to the transport at once
_CLOSE_GRACE_S: Final = 2.0  # a closing socket whose peer reads nothing is aborted after this


class Outbox:
    """The outgoing bytes of one connection. ``transport`` is set by the connection (it
    changes once, when TLS takes over) and ``pause()``/``resume()`` follow its flow control.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self._batch: list[bytes] = []  # produced in this turn of the loop
        self._batch_bytes = 0
        self._flush_scheduled = False
        # What waits for the transport to take it: once anything does, all that follows too.
        self._backlog: deque[memoryview] = deque()
        self._backlog_bytes = 0
        self.blocked = False  # the transport asked us to stop writing
        self._closing = False

    def queued_bytes(self) -> int:
        """What waits to be sent: queued here, and in the transport's buffer."""
        transport = self.transport
        buffered = transport.get_write_buffer_size() if transport is not None else 0
        return self._batch_bytes + self._backlog_bytes + buffered

    def write(self, data: bytes) -> None:
        """Queues ``data``; what this turn of the loop produces goes out in one write."""
        self._batch.append(data)
        self._batch_bytes += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def write_shared(self, head: bytes, payload: bytes) -> None:
        """Queues ``head``, then ``payload``: a bytes object other clients are sent too."""
        self.write(head)
        self._batch_to_backlog()
        self._backlog.append(memoryview(payload))
        self._backlog_bytes += len(payload)

    def flush(self) -> None:
        """Writes what is queued, as far as the transport takes it."""
        self._flush_scheduled = False
        if self._batch:
            transport = self.transport
            if self._backlog:
                self._batch_to_backlog()
            elif transport is not None and not transport.is_closing():
                transport.write(self._take_batch())
            else:
                self._take_batch()  # nowhere to go
        self._drain()

    def pause(self) -> None:
        self.blocked = True

    def resume(self) -> None:
        self.blocked = False
        self._drain()

    def close(self) -> None:
        """Closes the transport once what is queued is written; aborts it if its client has
        not read it all within a grace period."""
        transport = self.transport
        if transport is None or transport.is_closing() or self._closing:
            return
        self._closing = True
        self.flush()  # closes the transport if it takes everything
        if self._backlog or transport.get_write_buffer_size():
            # close() waits for the buffer to drain: a client that reads nothing would
            # keep it forever.
            self._loop.call_later(_CLOSE_GRACE_S, transport.abort)

    def _take_batch(self) -> bytes:
        data = self._batch[0] if len(self._batch) == 1 else b"".join(self._batch)
        self._batch.clear()
        self._batch_bytes = 0
        return data

    def _batch_to_backlog(self) -> None:
        if self._batch:
            data = self._take_batch()
            self._backlog.append(memoryview(data))
            self._backlog_bytes += len(data)

    def _drain(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        backlog = self._backlog
        while backlog and not self.blocked:
            view = backlog[0]
            if len(view) > _CHUNK:
                chunk, backlog[0] = view[:_CHUNK], view[_CHUNK:]
            else:
                chunk = backlog.popleft()
            self._backlog_bytes -= len(chunk)
            transport.write(chunk)  # may call pause_writing(): then the rest waits
        if self._closing and not backlog and not self._batch:
            transport.close()
