"""How settings are named in the environment, and how they are reported under those names.

Every variable starts with ``AGENT_``; nested fields are joined with ``__``. Validation errors
are reported one line per variable (``setting_errors``), a variable the settings do not have is
named with the one most likely meant (``unknown_variables``), and settings are shown with their
secrets masked (``redacted``).
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from agent.config.names import ENV_NESTED_DELIMITER, ENV_PREFIX
from agent.config.nearest import suggestions

NOT_SETTINGS = frozenset(
    {
        # The package build's (deploy/build-deb.sh exports it for nfpm).
        "AGENT_VERSION",
        # The tests' own knobs, in the environment of every agent a test run starts.
        "AGENT_TEST_DEBIAN_MIRROR",
        "AGENT_TEST_ROOTFS_CACHE",
        "AGENT_TEST_KEEP_WORKDIR",
        "AGENT_TESTS_THOROUGH",
        "AGENT_SOAK_SECONDS",
        "AGENT_SOAK_SEED",
    }
)
"""Names of the project's that start with ``AGENT_`` and are read outside the settings: not a
typo of a setting, whoever's environment holds them (a test of the repository finds every
such name it spells and fails on one missing here)."""


def redacted(settings: BaseModel) -> dict[str, Any]:
    """The settings as JSON-ready data with every secret masked, for logs and diagnostics."""
    return settings.model_dump(mode="json")


def setting_errors(exc: ValidationError, *, within: tuple[str, ...] = ()) -> list[str]:
    """One line per invalid setting, naming it as its environment variable.

    ``within`` is where the validated model sits under the top-level settings (``("mqtt",)``
    when an ``MqttSettings`` was validated on its own).
    """
    lines = []
    for error in exc.errors():
        path = [*within, *(str(part) for part in error["loc"])]
        # A list (AGENT_DEVICES) is one variable: its items are not variables of their own.
        named = path[: next((i for i, part in enumerate(path) if part.isdigit()), len(path))]
        variable = ENV_PREFIX + ENV_NESTED_DELIMITER.join(named).upper() if named else "settings"
        message = error["msg"].removeprefix("Value error, ")
        if not path and message.startswith(ENV_PREFIX):
            lines.append(message)  # a check across settings names its variables itself
            continue
        lines.append(f"{variable} ({'.'.join(path) or 'settings'}): {message}")
    return lines


def known_variables(model: type[BaseModel]) -> frozenset[str]:
    """Every variable the settings read: each field's, a section's as a whole (JSON) too."""
    return frozenset(_variables(model, ()))


def _variables(model: type[BaseModel], path: tuple[str, ...]) -> Iterator[str]:
    for name, field in model.model_fields.items():
        here = (*path, name)
        yield ENV_PREFIX + ENV_NESTED_DELIMITER.join(here).upper()
        for section in _sections(field.annotation):
            yield from _variables(section, here)


def _sections(annotation: Any) -> Iterator[type[BaseModel]]:
    """The settings models a field is (``TlsSettings``, ``TlsSettings | None``), not those it
    lists: the items of a list are not variables of their own."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    elif typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for member in typing.get_args(annotation):
            yield from _sections(member)


def unknown_variables(names: Iterable[str], known: Collection[str]) -> list[str]:
    """One line per ``AGENT_`` name that is neither a setting nor one of ``NOT_SETTINGS``,
    with the setting most likely meant: a misspelt variable is otherwise silently ignored,
    and the agent runs on its default (``AGENT_MQTT_PORT`` leaves the port at 1883)."""
    allowed = {name.upper() for name in known} | NOT_SETTINGS
    # Compared without the prefix every name shares, which would make them all look alike.
    settings = [name.removeprefix(ENV_PREFIX) for name in known]
    lines = []
    for name in sorted({n for n in names if n.upper().startswith(ENV_PREFIX)}):
        if name.upper() in allowed:
            continue
        meant = suggestions(name.upper().removeprefix(ENV_PREFIX), settings)
        hint = (
            f"did you mean {' or '.join(ENV_PREFIX + m for m in meant)}?"
            if meant
            else "agent --help lists the settings"
        )
        lines.append(f"{name}: no such setting; {hint}")
    return lines


def env_file_problem(path: Path) -> str | None:
    """Why ``--env-file path`` cannot be read as settings, or None when it can.

    A regular file of UTF-8 text, or the null device (an empty file: ``--env-file /dev/null``
    says "no settings from a file"). Anything else (a directory, a FIFO, which would block
    the start) is refused here, so that the error names the flag rather than ending in a
    traceback from the reader.
    """
    try:
        if not path.exists():
            return "no such file"
        if path.resolve() == Path(os.devnull):
            return None
        if not path.is_file():
            return "not a regular file (an env file of NAME=value lines is)"
        path.read_bytes().decode("utf-8")
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x})"
    return None
