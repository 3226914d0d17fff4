"""The TLS context of the MQTT connection, from ``mqtt.tls``."""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent.client.session_errors import SessionError, SettingNames, own_names

if TYPE_CHECKING:
    from agent.config import TlsSettings


class TlsSetupFailed(SessionError):
    """A file of ``mqtt.tls`` cannot be used: a settings problem, retrying will not help."""


def build_ssl_context(tls: TlsSettings, names: SettingNames = own_names) -> ssl.SSLContext | None:
    """The TLS context for ``tls``, or None when TLS is off.

    Verifies the broker's certificate (against ``ca_file``, or the system's trust store) and its
    host name; loads the client certificate for mutual TLS. Raises TlsSetupFailed naming the
    setting (by ``names``) when a file cannot be used; never prompts for the password of an
    encrypted key.
    """
    if not tls.enabled:
        return None
    try:
        context = ssl.create_default_context(
            cafile=str(tls.ca_file) if tls.ca_file is not None else None
        )
    except (OSError, ssl.SSLError) as exc:
        raise TlsSetupFailed(
            f"cannot use {names('mqtt.tls.ca_file')} {tls.ca_file} as the CAs to trust: "
            f"{_reason(exc)}"
        ) from None
    if tls.cert_file is not None:
        password: Callable[[], str] | str
        if tls.key_password is not None:
            password = tls.key_password.get_secret_value()
        else:
            # Without a callback OpenSSL would prompt on the terminal for an encrypted key.
            password = _no_key_password
        try:
            context.load_cert_chain(tls.cert_file, tls.key_file, password=password)
        except _KeyPasswordMissing:
            raise TlsSetupFailed(
                f"{names('mqtt.tls.key_file')} is encrypted; set {names('mqtt.tls.key_password')}"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise TlsSetupFailed(
                f"cannot use {names('mqtt.tls.cert_file')} {tls.cert_file} with "
                f"{names('mqtt.tls.key_file')} {tls.key_file}: {_reason(exc)} (a certificate "
                "and its key in PEM; for an encrypted key, its password in "
                f"{names('mqtt.tls.key_password')})"
            ) from None
    return context


def _reason(exc: BaseException) -> str:
    # OpenSSL's reason ("NO_CERTIFICATE_OR_CRL_FOUND", "BAD_DECRYPT") without the C file name.
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return exc.reason.replace("_", " ").lower()
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, ssl.SSLError):
        return exc.strerror
    return re.sub(r"^\[\w+\]\s*|\s*\(_ssl\.c:\d+\)$", "", str(exc)) or type(exc).__name__


class _KeyPasswordMissing(Exception):
    pass


def _no_key_password() -> str:
    raise _KeyPasswordMissing()
