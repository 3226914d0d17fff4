"""`agent --simulate --status`: the simulation as `agent status --watch` shows a real pair,
redrawn in place, with what to try and the latest log lines under it, so that a newcomer
sees the set points, the temperatures and the roles move."""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid

from agent.client.session import Session, SessionError
from agent.client.statestore import StateStoreClient
from agent.config import AgentSettings
from agent.logs import TextFormatter
from agent.ops.keys import KeyTemplates
from agent.ops.status_cli import show

RECENT_LINES = 8

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

    def footer() -> list[str]:
        return ["", *hints, "", "Latest log lines:", *recent.lines]

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
            )
    finally:
        await session.stop()
