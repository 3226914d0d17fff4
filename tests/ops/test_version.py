"""`agent --version`: the installed version, as the health documents name it."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata


def test_agent_says_its_version_and_exits() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agent", "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    version = metadata.version("agent")
    assert result.stdout.startswith(f"agent {version} (Python 3."), result.stdout
    assert result.stderr == ""
