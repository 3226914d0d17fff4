"""How settings are named in the environment, and how they are reported under those names.

Every variable starts with ``AGENT_``; nested fields are joined with ``__``. Validation errors
are reported one line per variable (``setting_errors``), and settings are shown with their secrets
masked (``redacted``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

ENV_PREFIX = "AGENT_"
ENV_NESTED_DELIMITER = "__"


def redacted(settings: BaseModel) -> dict[str, Any]:
    """The settings as JSON-ready data with every secret masked, for logs and diagnostics."""
    return settings.model_dump(mode="json")


def variable_name(path: str) -> str:
    """A setting's environment variable, from its path in the settings:
    ``mqtt.tls.cert_file`` -> ``AGENT_MQTT__TLS__CERT_FILE``."""
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(path.split(".")).upper()


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
