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

import argparse
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent", description=__doc__)
    parser.add_argument("--settings-fd", type=int, required=True)
    parser.add_argument("--line", help="shown in the process list; the settings name it")
    parser.add_argument("--instance", help="shown in the process list; the settings name it")
    args = parser.parse_args(argv)
    try:
        handover = received(args.settings_fd)
    except (OSError, pickle.UnpicklingError, EOFError, TypeError) as exc:
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
