"""How the command hands the checked settings to the agent's own process, and how that
process has the files checked again at a reload (agent.runtime.service says why). Light:
imported by the command before it becomes the agent."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from agent.config import AgentSettings

SERVICE = "agent.runtime.service"

CHECK_TIMEOUT_S = 30.0
"""How long a reload waits for the files to be checked (they are small and local)."""


@dataclass(frozen=True, slots=True)
class Handover:
    """What the command hands to the process it becomes."""

    settings: AgentSettings
    argv: tuple[str, ...]
    """The command's own arguments, to check the files again the same way at a reload."""
    version: str


def become(handover: Handover) -> NoReturn:
    """Replaces this process with the agent's own, running these settings."""
    fd = os.memfd_create("agent-settings", 0)  # inheritable: without MFD_CLOEXEC
    os.write(fd, pickle.dumps(handover, protocol=pickle.HIGHEST_PROTOCOL))
    line, instance = handover.settings.line.id, handover.settings.instance_id
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(
        sys.executable,
        [sys.executable, "-m", SERVICE, "--settings-fd", str(fd), "--line", line,
         "--instance", instance],
    )  # fmt: skip


def received(fd: int) -> Handover:
    with os.fdopen(fd, "rb") as file:
        file.seek(0)  # the command wrote it: the offset it shares is at its end
        return _handover(pickle.load(file))


def _handover(found: object) -> Handover:
    if not isinstance(found, Handover):
        raise TypeError(f"a {type(found).__name__}, not the settings")
    return found


def check_again(argv: Sequence[str]) -> AgentSettings | str:
    """The settings read and checked again by the command, or why they cannot be (one line).
    Blocks: called in a worker thread."""
    command = [sys.executable, "-m", "agent", *argv, "--hand-over"]
    try:
        done = subprocess.run(command, capture_output=True, timeout=CHECK_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"the files were not checked within {CHECK_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return f"the files could not be checked: {exc.strerror or exc}"
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip().splitlines()
        return "; ".join(reason) or f"the check of the files exited {done.returncode}"
    try:
        return _handover(pickle.loads(done.stdout)).settings
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError) as exc:
        return f"the check of the files answered nothing usable ({exc})"


def write_handover(handover: Handover) -> int:
    """`--hand-over`: the checked settings on standard output, for a reload."""
    sys.stdout.buffer.write(pickle.dumps(handover, protocol=pickle.HIGHEST_PROTOCOL))
    sys.stdout.flush()
    return 0
