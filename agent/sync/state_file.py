"""The last synced state on disk, written atomically, so that a restart knows whether a
difference between store and controller is a local or a remote change.

A write to the controller is saved as pending before it goes out, at once (`store`). A sync
may wait up to a second (`store_soon`): the pending entry saved before the write already
tells a restart that the unit holding that value holds the agent's write, so what the
sync adds is only the step after it, and one worker thread's turn saves every file whose
sync is due (`LaterSaves`) instead of one turn, and two wakeups of the event loop, a file.
A save never goes back: one asked later is never written over by an earlier one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from pathlib import Path

from agent.controller.points import SET_POINT
from agent.files import create_beside, fsync_directory, write_all
from agent.protocol.hlc import Hlc, HlcError
from agent.sync.decisions import Synced
from agent.sync.record import point_value

log = logging.getLogger(__name__)

LATER_S = 1.0
"""How long a sync's save may wait, at most, for the next batch."""

_State = tuple[int, Synced, tuple[Synced, ...]]
"""A save as asked: its generation (the order asked in), the sync, the pending writes."""


class LaterSaves:
    """The syncs whose save may wait: all that are due saved in one worker thread's turn,
    `within_s` after the first of them was asked; `flush()` saves them now (a stop)."""

    def __init__(self, within_s: float = LATER_S) -> None:
        self.within_s = within_s
        self._due: dict[Path, StateFile] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, file: StateFile) -> None:
        self._due[file.path] = file
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._after(), name="state files")

    async def _after(self) -> None:
        await asyncio.sleep(self.within_s)
        await self.flush()

    async def flush(self) -> None:
        due, self._due = list(self._due.values()), {}
        saves = [(file, state) for file in due if (state := file.take_later()) is not None]
        if saves:
            await asyncio.to_thread(_save_all, saves)

    async def close(self) -> None:
        """Saves what is due and stops waiting."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()


def _save_all(saves: list[tuple[StateFile, _State]]) -> None:
    """On a worker thread: each file's save; one that fails is said and the rest go on."""
    for file, state in saves:
        try:
            file.save_state(state)
        except OSError as exc:
            log.warning("could not save the synced state to %s: %s", file.path, exc)


class StateFile:
    """One point's file (the set point's by default): its values are read back as that
    point's kind, a mode as a text, occupancy as true or false, a set point as a number.
    `later`: where a sync's save waits (`store_soon`); without one it is saved at once."""

    def __init__(
        self,
        directory: Path,
        device_id: str,
        point: str = SET_POINT.name,
        *,
        later: LaterSaves | None = None,
    ) -> None:
        self.path = directory / f"{device_id}.synced.json"
        self.point = point
        self.later = later
        self._asked = 0
        self._saved = 0
        self._later: _State | None = None
        self._saving = threading.Lock()

    async def store(self, synced: Synced, pending: tuple[Synced, ...] = ()) -> None:
        """Saved now, on a worker thread: its fsyncs can take long on slow flash, and the
        event loop renews the lease. A sync still waiting is superseded (this is newer)."""
        self._later = None
        await asyncio.to_thread(self.save_state, self._ask(synced, pending))

    async def store_soon(self, synced: Synced, pending: tuple[Synced, ...] = ()) -> None:
        """Saved within `later.within_s`, with the other files due then (at once without
        `later`)."""
        if self.later is None:
            await self.store(synced, pending)
            return
        self._later = self._ask(synced, pending)
        self.later.add(self)

    def take_later(self) -> _State | None:
        state, self._later = self._later, None
        return state

    def _ask(self, synced: Synced, pending: tuple[Synced, ...]) -> _State:
        self._asked += 1
        return self._asked, synced, pending

    def save_state(self, state: _State) -> None:
        """`save()`, unless a save asked after this one was written already."""
        generation, synced, pending = state
        with self._saving:
            if generation <= self._saved:
                return
            self.save(synced, pending)
            self._saved = generation

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
            fd, tmp = create_beside(self.path.parent, ".synced-")
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = create_beside(self.path.parent, ".synced-")
        # One write of the whole document on the descriptor: a file object's buffered
        # writes of json.dump cost a third of a save's CPU, twice a remote change.
        try:
            try:
                write_all(fd, body)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        # The rename itself must reach the disk, or a power cut could undo it.
        fsync_directory(self.path.parent)
