"""Settings, read from the environment by pydantic-settings.

Every variable starts with ``AGENT_``; nested fields are joined with ``__``, so the broker host
is ``AGENT_MQTT__HOST`` and the CA file ``AGENT_MQTT__TLS__CA_FILE``. The sections are plain
``BaseModel``s so that every top-level settings class (``ConnectionSettings`` for the tools,
``AgentSettings`` for the agent) can reuse them as fields.

Secrets are ``SecretStr``: they print as ``**********`` in reprs, logs and ``model_dump``;
``get_secret_value()`` is called only where the value is handed to the MQTT client or OpenSSL.

One module per concern; the sections import none of each other but ``client_id``, and only
``settings`` imports the sections:

- ``environment``: the variables' prefix and separator, errors named by variable
  (``setting_errors``), variables that are no setting (``unknown_variables``), settings shown
  with their secrets masked (``redacted``);
- ``nearest``: the known names closest to a mistyped one;
- ``client_id``: which MQTT client ids are usable, and an instance's default one;
- ``mqtt``: the connection to the broker, its credentials and TLS;
- ``serial``: the serial line, and the Modbus options of the devices on it;
- ``devices``: the devices of a line (``AGENT_DEVICES`` or ``AGENT_DEVICES_FILE``), parsed and
  checked, and the ``Line`` they make up;
- ``profiles``: the profiles devices name (in ``AGENT_DEVICES_FILE``, ``AGENT_PROFILES_FILE``,
  or built in), checked and built into ``agent.controller.profile.Profile``s for the line's
  driver (the one section that imports ``agent.controller``);
- ``lock``, ``telemetry``, ``health``, ``keys``: one section each;
- ``credentials``: secrets from systemd's credential files, a settings source;
- ``settings``: ``ConnectionSettings`` and ``AgentSettings``, composed of the sections, and
  ``resolve_line``, the one line the agent's settings must describe;
- ``running``: the settings as the running agent holds them, plain values with the models'
  own methods; ``line`` and ``names``, the line, the device ids and the variables' names:
  the three modules the running agent imports, none of which imports pydantic.

Import the names below from this package: each is imported when first asked for, so that
importing ``agent.config.running`` does not import pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.config.client_id import check_client_id, default_client_id
    from agent.config.credentials import CREDENTIAL_FILES, _CredentialsSource
    from agent.config.devices import DeviceSettings, ModbusOverrides, check_devices, parse_devices
    from agent.config.environment import (
        env_file_problem,
        known_variables,
        redacted,
        setting_errors,
        unknown_variables,
    )
    from agent.config.health import HealthSettings
    from agent.config.keys import KeySettings
    from agent.config.line import MAX_UNIT_LOADS, Line, check_id
    from agent.config.lock import LockSettings
    from agent.config.mqtt import MqttSettings, TlsSettings
    from agent.config.names import ENV_NESTED_DELIMITER, ENV_PREFIX, variable_name
    from agent.config.running import as_running
    from agent.config.serial import SerialSettings
    from agent.config.settings import (
        AgentSettings,
        ConnectionSettings,
        LineConfigError,
        resolve_line,
    )
    from agent.config.telemetry import TelemetrySettings

_MODULE_OF = {
    "check_client_id": "client_id",
    "default_client_id": "client_id",
    "CREDENTIAL_FILES": "credentials",
    "_CredentialsSource": "credentials",
    "MAX_UNIT_LOADS": "line",
    "Line": "line",
    "check_id": "line",
    "DeviceSettings": "devices",
    "ModbusOverrides": "devices",
    "check_devices": "devices",
    "parse_devices": "devices",
    "ENV_NESTED_DELIMITER": "names",
    "ENV_PREFIX": "names",
    "variable_name": "names",
    "env_file_problem": "environment",
    "known_variables": "environment",
    "redacted": "environment",
    "setting_errors": "environment",
    "unknown_variables": "environment",
    "HealthSettings": "health",
    "KeySettings": "keys",
    "LockSettings": "lock",
    "MqttSettings": "mqtt",
    "TlsSettings": "mqtt",
    "SerialSettings": "serial",
    "AgentSettings": "settings",
    "ConnectionSettings": "settings",
    "LineConfigError": "settings",
    "resolve_line": "settings",
    "TelemetrySettings": "telemetry",
    "as_running": "running",
}

__all__ = [
    "CREDENTIAL_FILES",
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "MAX_UNIT_LOADS",
    "AgentSettings",
    "ConnectionSettings",
    "DeviceSettings",
    "HealthSettings",
    "KeySettings",
    "Line",
    "LineConfigError",
    "LockSettings",
    "ModbusOverrides",
    "MqttSettings",
    "SerialSettings",
    "TelemetrySettings",
    "TlsSettings",
    "_CredentialsSource",
    "as_running",
    "check_client_id",
    "check_devices",
    "check_id",
    "default_client_id",
    "env_file_problem",
    "known_variables",
    "parse_devices",
    "redacted",
    "resolve_line",
    "setting_errors",
    "unknown_variables",
    "variable_name",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'agent.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"agent.config.{module}"), name)
    globals()[name] = value
    return value
