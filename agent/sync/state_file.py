"""The last synced state on disk, written atomically, so that a restart knows whether a
difference between store and controller is a local or a remote change."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from pathlib import Path

from agent.controller.points import SET_POINT
from agent.protocol.hlc import Hlc, HlcError
from agent.sync.decisions import Synced
from agent.sync.record import point_value

log = logging.getLogger(__name__)


class StateFile:
    """One point's file (the set point's by default): its values are read back as that
    point's kind, a mode as a text, occupancy as true or false, a set point as a number."""

    def __init__(self, directory: Path, device_id: str, point: str = SET_POINT.name) -> None:
        self.path = directory / f"{device_id}.synced.json"
        self.point = point
        self._writing: asyncio.Lock | None = None

    async def store(self, synced: Synced, pending: tuple[Synced, ...] = ()) -> None:
        """`save()` on a worker thread: its fsyncs can take long on slow flash, and the
        event loop renews the lease. One write at a time, in the order asked."""
        if self._writing is None:
            self._writing = asyncio.Lock()
        async with self._writing:
            await asyncio.to_thread(self.save, synced, pending)

    def load_pending(self) -> tuple[Synced, ...]:
        """The writes to the controller that were in doubt when the file was written."""
        try:
            entries = json.loads(self.path.read_text()).get("pending", [])
            return tuple(
                Synced(point_value(self.point, entry["value"]), Hlc.parse(entry["version"]))
                for entry in entries
            )
        except FileNotFoundError:
            return ()
        except (OSError, ValueError, TypeError, AttributeError, KeyError, HlcError) as exc:
            log.warning("ignoring the pending writes in %s: %s", self.path, exc)
            return ()

    def load(self) -> Synced:
        try:
            data = json.loads(self.path.read_text())
            value = data.get("value")
            version = data.get("version")
            return Synced(
                None if value is None else point_value(self.point, value),
                None if version is None else Hlc.parse(version),
            )
        except FileNotFoundError:
            return Synced()
        except (OSError, ValueError, TypeError, AttributeError, HlcError) as exc:
            # A damaged file must not stop the agent: it only loses the hint of direction.
            log.warning("ignoring unreadable state file %s: %s", self.path, exc)
            return Synced()

    def save(self, synced: Synced, pending: tuple[Synced, ...] = ()) -> None:
        data: dict[str, object] = {
            "value": synced.value,
            "version": None if synced.version is None else str(synced.version),
        }
        if pending:
            data["pending"] = [
                {"value": write.value, "version": str(write.version)} for write in pending
            ]
        body = json.dumps(data).encode()
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".synced-", suffix=".tmp")
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".synced-", suffix=".tmp")
        # One write of the whole document on the descriptor: a file object's buffered
        # writes of json.dump cost a third of a save's CPU, twice a remote change.
        try:
            try:
                remaining = memoryview(body)
                while remaining:  # a regular file's write may be short (a full disk)
                    remaining = remaining[os.write(fd, remaining) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        # The rename itself must reach the disk, or a power cut could undo it.
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
