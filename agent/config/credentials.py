"""Secrets read from credential files (systemd ``LoadCredential=``), a settings source."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic_settings import PydanticBaseSettingsSource

# The credential files (systemd LoadCredential=) and the secret each one holds.
CREDENTIAL_FILES: dict[str, tuple[str, ...]] = {
    "mqtt-password": ("mqtt", "password"),
    "mqtt-key-password": ("mqtt", "tls", "key_password"),
}


class _CredentialsSource(PydanticBaseSettingsSource):
    """Secrets from files in $CREDENTIALS_DIRECTORY (systemd LoadCredential=)."""

    FILES: ClassVar[dict[str, tuple[str, ...]]] = CREDENTIAL_FILES

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        directory = os.environ.get("CREDENTIALS_DIRECTORY")
        found: dict[str, Any] = {}
        if not directory:
            return found
        for name, path in self.FILES.items():
            file = Path(directory) / name
            if file.is_file():
                node = found
                for part in path[:-1]:
                    node = node.setdefault(part, {})
                node[path[-1]] = file.read_text().rstrip("\n")
        return found
