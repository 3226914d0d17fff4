"""Logging for operators: one line per event, to stderr (journald adds the time).

Every line names the device and instance it is about. They come from a context variable,
so that two agents in one process (`agent --simulate --pair`) each get their own.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys

_where: contextvars.ContextVar[str] = contextvars.ContextVar("agent_where", default="-")


def set_context(device: str, instance: str) -> None:
    """Names the device and instance in every line logged from this task and its children."""
    _where.set(f"{device}/{instance}")


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        device = getattr(record, "device", None)
        where = _where.get()
        if device is not None:
            line, _, instance = where.partition("/")
            where = f"{line}/{device}/{instance}" if device != line else where
        record.where = where
        return True


def setup(level: str | None = None) -> None:
    level_name = (level or os.environ.get("AGENT_LOG_LEVEL") or "INFO").upper()
    # Under systemd the journal stamps each line; elsewhere a timestamp helps.
    with_time = "INVOCATION_ID" not in os.environ
    fmt = "%(levelname)s [%(where)s] %(name)s: %(message)s"
    if with_time:
        fmt = "%(asctime)s " + fmt
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    handler.addFilter(_ContextFilter())
    logging.basicConfig(level=level_name, handlers=[handler], force=True)
    # Library chatter (gmqtt logs every packet at INFO) is not an operator's event.
    for noisy in ("gmqtt", "apscheduler", "pymodbus"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
