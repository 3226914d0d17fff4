"""The installed package's version, looked up once per process: the command looks it up, and
hands it to the agent's own process (agent.runtime.handover), which so never imports
importlib.metadata (2.8 MB of its memory, with the email package that comes with it)."""

from __future__ import annotations

_version: str | None = None


def installed() -> str:
    """The version: reading the package's metadata takes milliseconds, and every health
    document names it."""
    global _version
    if _version is None:
        from importlib import metadata  # here only: see the module's docstring

        try:
            _version = metadata.version("agent")
        except metadata.PackageNotFoundError:
            _version = "unknown"
    return _version


def handed_over(version: str) -> None:
    """The version the command looked up, taken as this process's own."""
    global _version
    _version = version
