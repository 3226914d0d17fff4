"""The agent's own process: what `agent` becomes once its settings are checked.

The command (`agent.runtime.cli`) reads and validates the settings with pydantic, then
replaces itself with this module (`exec`: the same pid, so that systemd's main process and
its notifications stay the same), handing over the settings as plain values
(`agent.config.running`) in an anonymous file. This process never imports pydantic (its
memory went from 46 to 34 MB with APScheduler gone too: docs/figures.md). A reload checks
the files again in a short-lived process of the command's own (`agent ... --hand-over`),
which answers the same way on its output.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import platform
import signal
import sys
from collections.abc import Sequence

from agent import logs
from agent.runtime import version
from agent.runtime.agent import Agent
from agent.runtime.exits import EXIT_CONFIG
from agent.runtime.handover import Handover, check_again, received
from agent.runtime.notify import Notifier

log = logging.getLogger("agent")


async def run(handover: Handover) -> int:
    settings = handover.settings
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    logs.set_context(line=settings.line.id, instance=settings.instance_id)
    log.info(
        "agent %s starting (Python %s, pid %d)",
        handover.version,
        platform.python_version(),
        os.getpid(),
    )
    notifier = Notifier()
    try:
        agent = Agent(settings, notifier=notifier)
        # systemctl reload (ExecReload=): the devices and profiles read again.
        loop.add_signal_handler(
            signal.SIGHUP, agent.request_reload, lambda: check_again(handover.argv)
        )
        return await agent.run(stop)
    finally:
        notifier.close()


OPTIONS = ("--settings-fd", "--line", "--instance")
"""The handover's descriptor; the line and instance only shown in the process list."""


def options(argv: Sequence[str]) -> dict[str, str]:
    """`--name value` or `--name=value` of OPTIONS (no argparse: a command line only
    agent.runtime.handover writes, parsed without its 0.4 MB)."""
    found: dict[str, str] = {}
    args = iter(argv)
    for arg in args:
        name, given, value = arg.partition("=")
        if name not in OPTIONS:
            raise ValueError(f"unknown option {arg!r}")
        if not given:
            value = next(args, "")
        if not value:
            raise ValueError(f"{name} needs a value")
        found[name] = value
    return found


def main(argv: Sequence[str] | None = None) -> int:
    try:
        fd = options(sys.argv[1:] if argv is None else argv).get("--settings-fd")
        if fd is None:
            raise ValueError("no --settings-fd")
        handover = received(int(fd))
    except (OSError, ValueError, pickle.UnpicklingError, EOFError, TypeError) as exc:
        logs.console_error(f"agent: no settings handed over ({exc}): start it as `agent`")
        return EXIT_CONFIG
    logs.setup(handover.settings.log_level)
    version.handed_over(handover.version)
    try:
        return asyncio.run(run(handover))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
