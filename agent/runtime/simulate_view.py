"""`agent --simulate --status`: the simulation as `agent status --watch` shows a real pair,
redrawn in place, with what to try and the latest log lines under it, so that a newcomer
sees the set points, the temperatures and the roles move."""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import shutil
import uuid
from typing import TYPE_CHECKING

from agent.client.session import Session, SessionError
from agent.client.statestore import StateStoreClient
from agent.logs import TextFormatter
from agent.ops.keys import KeyTemplates
from agent.ops.status_cli import show

if TYPE_CHECKING:
    from agent.config import AgentSettings

RECENT_LINES = 8
FOOTER_ROWS = 2
"""Kept under the status view at least: the view has the screen first (a line of 8 fits
24 rows), what to try and the log take the rows it leaves."""

log = logging.getLogger("agent")


class RecentLines(logging.Handler):
    """Keeps the last log lines for the view, instead of writing them over it."""

    def __init__(self, size: int = RECENT_LINES) -> None:
        super().__init__()
        self.lines: collections.deque[str] = collections.deque(maxlen=size)
        self.setFormatter(TextFormatter(with_time=False))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record)[:160])
        except Exception:  # never let the view break logging
            self.handleError(record)


def capture_logs() -> RecentLines:
    """The log goes to the view from now on; the broker's chatter is left out."""
    handler = RecentLines()
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    logging.getLogger("agent.emulator").setLevel(logging.WARNING)
    return handler


async def status_view(
    settings: AgentSettings, hints: list[str], recent: RecentLines, stop: asyncio.Event
) -> None:
    """Redraws the line's status until `stop`."""
    session = Session(settings.mqtt, client_id=f"agent-simulate-view-{uuid.uuid4().hex[:8]}")
    try:
        await session.start(wait=True, timeout=10)
    except SessionError as exc:
        log.error("status view: cannot connect: %s", exc)
        return
    templates = KeyTemplates(keys=settings.keys, health=settings.health)

    def footer(rows: int) -> list[str]:
        return fit_footer(hints, list(recent.lines), rows, shutil.get_terminal_size().columns)

    try:
        async with StateStoreClient(session) as client:
            await show(
                client,
                templates,
                settings.line.id,
                as_json=False,
                watch=True,
                interval=1.0,
                stop=stop,
                footer=footer,
                footer_rows=FOOTER_ROWS,
                force=True,  # shown from the start, before the agents first report
            )
    finally:
        await session.stop()


def fit_footer(hints: list[str], logs: list[str], rows: int, width: int) -> list[str]:
    """What to try and the latest log lines, in `rows` rows of `width` columns: all of it
    when it fits; else a third for the log and the hints cut (a command is never cut in
    the middle, a log line is)."""
    hints = [h for h in hints if h.strip()]
    logs = [line[:width] for line in logs]

    def height(lines: list[str]) -> int:
        return sum(max(1, math.ceil(len(line) / max(1, width))) for line in lines)

    room = rows - 1  # a blank line above
    if room <= 0:
        return []
    log = ["Latest log lines:", *logs]
    if height(hints) + len(log) <= room:
        return ["", *hints, *log]
    log_rows = min(len(log), room // 3)
    log = log[:1] + logs[len(logs) - log_rows + 1 :] if log_rows >= 2 else []
    shown: list[str] = []
    for index, hint in enumerate(hints):
        more = f"({len(hints) - index} more lines of what to try in a taller terminal)"
        if height([*shown, hint]) + height([more]) + len(log) > room and index < len(hints) - 1:
            shown.append(more)
            break
        shown.append(hint)
    while shown and height(shown) + len(log) > room:
        shown.pop()
    return ["", *shown, *log]
