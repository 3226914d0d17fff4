"""What a CONNECT says about who we are: user name and password, or a Kubernetes service
account token (MQTT 5 enhanced authentication, method ``K8S-SAT``).

The token is read from ``mqtt.sat_file`` for every connection attempt: the kubelet replaces a
projected token before it expires, and a reconnect must present the current one.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from agent.client.session_errors import SessionError, SettingNames, own_names

if TYPE_CHECKING:
    from agent.config import MqttSettings

K8S_SAT: Final = "K8S-SAT"
# Authentication Data is Binary Data: a two-byte length, then the bytes (MQTT 5 §1.5.6).
_MAX_AUTH_DATA: Final = 65_535


@dataclass(frozen=True)
class Credentials:
    """Secrets stay out of the repr, so that no log line or traceback can show them."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    auth_method: str | None = None
    auth_data: bytes | None = field(default=None, repr=False)


def read_credentials(settings: MqttSettings, names: SettingNames = own_names) -> Credentials:
    """The credentials of the next CONNECT. Raises SessionError when the token file cannot be
    read or is unusable (the session retries: the kubelet may be replacing it)."""
    password = settings.password.get_secret_value() if settings.password is not None else None
    if settings.sat_file is None:
        return Credentials(settings.username, password)
    path = settings.sat_file
    setting = names("mqtt.sat_file")
    try:
        token = path.read_bytes().strip()
    except OSError as exc:
        raise SessionError(
            f"cannot read the service account token ({setting} {path}): "
            f"{exc.strerror or type(exc).__name__}"
        ) from None
    if not token:
        raise SessionError(f"the service account token file ({setting} {path}) is empty")
    if len(token) > _MAX_AUTH_DATA:
        raise SessionError(
            f"the service account token ({setting} {path}) is longer than "
            f"{_MAX_AUTH_DATA} bytes, more than MQTT's Authentication Data can carry"
        )
    return Credentials(settings.username, None, K8S_SAT, token)


def exposed_secret(settings: MqttSettings) -> str | None:
    """What secret a CONNECT would send in clear text across a network, or None.

    A password or a token sent without TLS to anything but this machine can be read by anyone
    on the path; on the loopback interface (a local broker, the emulator) it cannot.
    """
    if settings.tls.enabled or _is_loopback(settings.host):
        return None
    if settings.sat_file is not None:
        return "the service account token"
    if settings.password is not None:
        return "the password"
    return None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
