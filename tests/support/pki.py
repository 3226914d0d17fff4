"""A throwaway PKI for TLS tests, made with the `cryptography` package.

A CA, a second CA that signed nothing of the broker's, server certificates (good, expired,
for another host name) and client certificates (good, encrypted key, from the other CA).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_PASSWORD = "k3y-pa55-Phrase"
_DAY = datetime.timedelta(days=1)
_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    server_expired_cert: Path  # expired yesterday, otherwise like server_cert
    server_other_host_cert: Path  # for other.example only, with server_key
    client_cert: Path
    client_key: Path
    client_key_encrypted: Path  # password: KEY_PASSWORD
    other_ca: Path  # a CA that signed nothing the broker presents
    other_client_cert: Path  # signed by other_ca, with client_key
    ca_key: Path


@dataclass(frozen=True)
class _Issuer:
    name: x509.Name
    key: ec.EllipticCurvePrivateKey


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _ca(common_name: str) -> tuple[_Issuer, x509.Certificate]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + 2 * _DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return _Issuer(cert.subject, key), cert


def _leaf(
    issuer: _Issuer,
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    *,
    server: bool,
    hosts: list[x509.GeneralName] | None = None,
    expired: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    start, end = (now - 3 * _DAY, now - _DAY) if expired else (now - _DAY, now + 2 * _DAY)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(issuer.name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), False
        )
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(hosts), critical=False)
    return builder.sign(issuer.key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, password: str | None = None) -> Path:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password is not None
        else serialization.NoEncryption()
    )
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    path.chmod(0o600)
    return path


def make_pki(directory: Path) -> Pki:
    ca, ca_cert = _ca("agent-test-ca")
    other, other_cert = _ca("agent-test-other-ca")
    local = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    ]
    server_key, client_key = _key(), _key()
    return Pki(
        ca=_write_cert(directory / "ca.crt", ca_cert),
        ca_key=_write_key(directory / "ca.key", ca.key),
        server_cert=_write_cert(
            directory / "server.crt", _leaf(ca, "localhost", server_key, server=True, hosts=local)
        ),
        server_key=_write_key(directory / "server.key", server_key),
        server_expired_cert=_write_cert(
            directory / "server-expired.crt",
            _leaf(ca, "localhost", server_key, server=True, hosts=local, expired=True),
        ),
        server_other_host_cert=_write_cert(
            directory / "server-other-host.crt",
            _leaf(
                ca,
                "other.example",
                server_key,
                server=True,
                hosts=[x509.DNSName("other.example")],
            ),
        ),
        client_cert=_write_cert(
            directory / "client.crt", _leaf(ca, "agent-client", client_key, server=False)
        ),
        client_key=_write_key(directory / "client.key", client_key),
        client_key_encrypted=_write_key(
            directory / "client-encrypted.key", client_key, KEY_PASSWORD
        ),
        other_ca=_write_cert(directory / "other-ca.crt", other_cert),
        other_client_cert=_write_cert(
            directory / "other-client.crt", _leaf(other, "intruder", client_key, server=False)
        ),
    )
