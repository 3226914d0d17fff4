"""Topics and user property names of the state store protocol (protocol.md §1, §7)."""

from __future__ import annotations

import base64
from typing import Final

SERVICE_ID: Final = "FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8"
INVOKE_TOPIC: Final = f"statestore/v1/{SERVICE_ID}/command/invoke"
_NOTIFY_PREFIX: Final = f"clients/statestore/v1/{SERVICE_ID}"

PROTOCOL_VERSION: Final = "1.0"
CONTENT_TYPE: Final = "application/octet-stream"

# User property names.
TIMESTAMP: Final = "__ts"
FENCING_TOKEN: Final = "__ft"
SOURCE_ID: Final = "__srcId"
PROTOCOL_VERSION_PROPERTY: Final = "__protVer"
STATUS: Final = "__stat"


def hex_upper(data: bytes) -> str:
    """RFC 4648 base16, upper-case."""
    return base64.b16encode(data).decode()


def notify_topic(client_id: str, key: bytes) -> str:
    return f"{_NOTIFY_PREFIX}/{hex_upper(client_id.encode())}/command/notify/{hex_upper(key)}"


def notify_filter(client_id: str) -> str:
    """What a client subscribes to for all of its notifications."""
    return f"{_NOTIFY_PREFIX}/{hex_upper(client_id.encode())}/command/notify/+"


def key_from_notify_topic(topic: str) -> bytes | None:
    """The key a notification topic names, or None when it is not one."""
    head, sep, key_hex = topic.rpartition("/command/notify/")
    if not sep or not head.startswith(_NOTIFY_PREFIX + "/"):
        return None
    try:
        return base64.b16decode(key_hex)
    except ValueError:
        return None


def response_topic(client_id: str) -> str:
    return f"clients/{client_id}/services/statestore/_any_/command/invoke/response"


def is_forbidden_response_topic(topic: str) -> bool:
    """Responses must not go to the invoke topic nor into the service's notify space."""
    return topic == INVOKE_TOPIC or topic.startswith(_NOTIFY_PREFIX)
