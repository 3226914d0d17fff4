"""MQTT client ids: which ones are usable, and the default one of an instance."""

from __future__ import annotations

import hashlib
import re

# Client ids end up inside topic names (the state store's response topic embeds the client id),
# so wildcards and level separators would break routing.
_CLIENT_ID_FORBIDDEN = re.compile(r"[+#/\x00-\x1f\x7f]")
_CLIENT_ID_MAX_BYTES = 256
# What default_client_id keeps of the device and instance ids; everything else becomes "-".
_CLIENT_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_DEFAULT_CLIENT_ID_MAX = 64


def check_client_id(client_id: str) -> str:
    """Raise ValueError unless client_id is usable as an MQTT client id and inside topics."""
    if not client_id:
        raise ValueError("client id must not be empty")
    if len(client_id.encode()) > _CLIENT_ID_MAX_BYTES:
        raise ValueError(f"client id is longer than {_CLIENT_ID_MAX_BYTES} bytes")
    bad = _CLIENT_ID_FORBIDDEN.search(client_id)
    if bad:
        raise ValueError(f"client id must not contain {bad.group()!r}")
    return client_id


def default_client_id(device_id: str, instance_id: str, *, prefix: str = "agent") -> str:
    """A stable client id for one instance on one device: ``agent-<device>-<instance>``.

    The same device and instance always give the same id, so a restarted instance takes over its
    own session at the broker; a different instance id gives a different client id. Characters
    outside ``A-Za-z0-9._-`` become ``-``; an id longer than 64 characters is cut and suffixed
    with a hash of the full id so that it stays unique.
    """
    if not device_id or not instance_id:
        raise ValueError("device id and instance id must not be empty")
    raw = f"{prefix}-{device_id}-{instance_id}"
    safe = _CLIENT_ID_UNSAFE.sub("-", raw)
    if len(safe) > _DEFAULT_CLIENT_ID_MAX or safe != raw:
        # Hash the original so that two ids differing only in replaced characters stay distinct.
        digest = hashlib.sha256(raw.encode()).hexdigest()[:10]
        safe = f"{safe[: _DEFAULT_CLIENT_ID_MAX - len(digest) - 1]}-{digest}"
    return check_client_id(safe)
