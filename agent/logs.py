"""Logging for operators: one line per event, to stderr (journald adds the time)."""

from __future__ import annotations

import logging
import os
import sys


def setup(level: str | None = None) -> None:
    level_name = (level or os.environ.get("AGENT_LOG_LEVEL") or "INFO").upper()
    # Under systemd the journal stamps each line; elsewhere a timestamp helps.
    with_time = "INVOCATION_ID" not in os.environ
    fmt = "%(levelname)s %(name)s: %(message)s"
    if with_time:
        fmt = "%(asctime)s " + fmt
    logging.basicConfig(level=level_name, format=fmt, stream=sys.stderr, force=True)
    # Library chatter (gmqtt logs every packet at INFO) is not an operator's event.
    for noisy in ("gmqtt", "apscheduler", "pymodbus"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
