"""The TLS context of the MQTT connection, from ``mqtt.tls``."""

from __future__ import annotations

import ssl
from collections.abc import Callable

from agent.client.session_errors import SessionError
from agent.config import TlsSettings


def build_ssl_context(tls: TlsSettings) -> ssl.SSLContext | None:
    """The TLS context for ``tls``, or None when TLS is off.

    Verifies the broker's certificate (against ``ca_file``, or the system's trust store) and its
    host name; loads the client certificate for mutual TLS. Raises SessionError naming the
    setting when a file cannot be used; never prompts for the password of an encrypted key.
    """
    if not tls.enabled:
        return None
    try:
        context = ssl.create_default_context(
            cafile=str(tls.ca_file) if tls.ca_file is not None else None
        )
        if tls.cert_file is not None:
            password: Callable[[], str] | str
            if tls.key_password is not None:
                password = tls.key_password.get_secret_value()
            else:
                # Without a callback OpenSSL would prompt on the terminal for an encrypted key.
                password = _no_key_password
            context.load_cert_chain(tls.cert_file, tls.key_file, password=password)
    except (OSError, ssl.SSLError, _KeyPasswordMissing) as exc:
        raise SessionError(f"cannot set up TLS from mqtt.tls: {exc}") from None
    return context


class _KeyPasswordMissing(Exception):
    pass


def _no_key_password() -> str:
    raise _KeyPasswordMissing("mqtt.tls.key_file is encrypted; set mqtt.tls.key_password")
