"""The dependency audit of requirements.lock: run pip-audit on it and judge what it says.

pip-audit asks PyPI's JSON API about each locked release (``/pypi/NAME/VERSION/json``). When
the service cannot be reached, or answers nothing about any release (a mirror or proxy that
only serves the index), there is no verdict to give: the audit is skipped, saying why. A
release the service knows nothing about while it knows the others is a failure: it could
not be audited.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

_UNREACHABLE = re.compile(
    r"ConnectionError|Max retries exceeded|Failed to resolve|NameResolutionError|"
    r"timed out|Temporary failure in name resolution|Connection refused|SSLError",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Verdict:
    kind: Literal["clean", "vulnerable", "unreachable", "failed"]
    detail: str


def judge(returncode: int, stdout: str, stderr: str) -> Verdict:
    """What a ``pip-audit --format json`` run says about the lock."""
    try:
        report = json.loads(stdout)
        dependencies = report["dependencies"]
    except (ValueError, KeyError, TypeError):
        if _UNREACHABLE.search(stderr):
            return Verdict("unreachable", _last_line(stderr))
        return Verdict("failed", f"pip-audit exited {returncode}: {_last_line(stderr)}")
    vulnerable = [
        f"{d['name']} {d.get('version', '?')}: "
        + ", ".join(
            f"{v['id']} (fixed in {', '.join(v.get('fix_versions') or []) or 'no release yet'})"
            for v in d["vulns"]
        )
        for d in dependencies
        if d.get("vulns")
    ]
    if vulnerable:
        return Verdict("vulnerable", "; ".join(vulnerable))
    skipped = [d for d in dependencies if d.get("skip_reason")]
    if dependencies and len(skipped) == len(dependencies):
        return Verdict(
            "unreachable",
            "the advisory service answered about none of the locked releases "
            f"(for example: {skipped[0]['skip_reason']})",
        )
    if skipped:
        return Verdict("failed", "; ".join(d["skip_reason"] for d in skipped))
    if returncode != 0:
        return Verdict("failed", f"pip-audit exited {returncode}: {_last_line(stderr)}")
    return Verdict("clean", f"{len(dependencies)} locked releases, no known vulnerability")


def audit(lock: Path, timeout: float = 300) -> Verdict:
    """pip-audit of a fully pinned, hashed lock: no resolution, no virtual environment."""
    command = [
        sys.executable, "-m", "pip_audit", "--requirement", str(lock), "--disable-pip",
        "--format", "json", "--progress-spinner", "off", "--timeout", "30",
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Verdict("unreachable", f"no answer within {timeout:g} s")
    return judge(result.returncode, result.stdout, result.stderr)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(nothing on stderr)"
