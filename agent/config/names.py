"""How a setting is named in the environment. Pure."""

from __future__ import annotations

ENV_PREFIX = "AGENT_"
ENV_NESTED_DELIMITER = "__"


def variable_name(path: str) -> str:
    """A setting's environment variable, from its path in the settings:
    ``mqtt.tls.cert_file`` -> ``AGENT_MQTT__TLS__CERT_FILE``."""
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(path.split(".")).upper()
