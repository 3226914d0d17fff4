"""TLS for the embedded broker: the server context, and a client certificate's subject."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# OpenSSL's long attribute names (as ssl.getpeercert() gives them) -> RFC 4514 short ones.
_SHORT_NAMES = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


class TlsConfigError(ValueError):
    """Certificate, key or CA files that cannot be used; the message names the file."""


def server_context(
    cert_file: Path, key_file: Path, client_ca_file: Path | None = None
) -> ssl.SSLContext:
    """TLS 1.2 or newer; with ``client_ca_file``, clients must show a certificate it signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(
            f"cannot use the certificate {cert_file} with the key {key_file}: {exc}"
        ) from None
    if client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"cannot use the client CA {client_ca_file}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def subject_of(peercert: dict[str, Any] | None) -> str | None:
    """The subject of a verified peer certificate as an RFC 4514 string, e.g. ``CN=gw1,O=plant``.

    The same text as ``cryptography``'s ``Name.rfc4514_string()`` for the usual attributes.
    """
    if not peercert or not peercert.get("subject"):
        return None
    rdns: Sequence[Sequence[tuple[str, str]]] = peercert["subject"]
    parts = []
    for rdn in reversed(rdns):  # RFC 4514 lists the most specific first
        parts.append(
            "+".join(f"{_SHORT_NAMES.get(name, name)}={_escape(value)}" for name, value in rdn)
        )
    return ",".join(parts)


def _escape(value: str) -> str:
    out = []
    for index, char in enumerate(value):
        if char in ',+"\\<>;' or (
            (index == 0 and char in "# ") or (index == len(value) - 1 and char == " ")
        ):
            out.append("\\" + char)
        elif char == "\0":
            out.append("\\00")
        else:
            out.append(char)
    return "".join(out)
