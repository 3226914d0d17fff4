"""What the MQTT session raises, and how a CONNACK refusal or a failed connect is classified.

Pure: no I/O and no gmqtt. ``connack_error`` decides whether retrying can help (a broker that
is busy) or not (bad credentials, MQTT 5 refused); ``is_definitive`` decides which network
failures a person waiting at a command line should hear about at once rather than after the
retries (the long-running agent retries them all).

A message that says which setting to check names it as the person who made the settings
knows it (``SettingNames``): the flag they typed, or the environment variable.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from typing import Final, TypeAlias

SettingNames: TypeAlias = Callable[[str], str]
"""A connection setting's name for the person who made the settings, from its path in the
settings (``mqtt.password``, ``mqtt.tls.cert_file``): ``--password-file`` for ``agent
store``, ``AGENT_MQTT__PASSWORD`` for the agent. The session's messages name settings
through it."""


def own_names(path: str) -> str:
    """The settings' own names (``mqtt.tls.cert_file``): for a session no command made."""
    return path


# MQTT 5 reason codes (section 2.4) by the names the spec gives them where they are refusals.
_REASON_NAMES: Final = {
    0x00: "success",
    0x01: "granted qos 1",
    0x02: "granted qos 2",
    0x10: "no matching subscribers",
    0x11: "no subscription existed",
    0x80: "unspecified error",
    0x81: "malformed packet",
    0x82: "protocol error",
    0x83: "implementation specific error",
    0x84: "unsupported protocol version",
    0x85: "client identifier not valid",
    0x86: "bad user name or password",
    0x87: "not authorized",
    0x88: "server unavailable",
    0x89: "server busy",
    0x8A: "banned",
    0x8B: "server shutting down",
    0x8C: "bad authentication method",
    0x8D: "keep alive timeout",
    0x8E: "session taken over",
    0x8F: "topic filter invalid",
    0x90: "topic name invalid",
    0x91: "packet identifier in use",
    0x93: "receive maximum exceeded",
    0x95: "packet too large",
    0x96: "message rate too high",
    0x97: "quota exceeded",
    0x98: "administrative action",
    0x99: "payload format invalid",
    0x9A: "retain not supported",
    0x9B: "qos not supported",
    0x9C: "use another server",
    0x9D: "server moved",
    0x9E: "shared subscriptions not supported",
    0x9F: "connection rate exceeded",
    0xA1: "subscription identifiers not supported",
    0xA2: "wildcard subscriptions not supported",
}

UNSUPPORTED_PROTOCOL_VERSION: Final = 0x84
V311_UNACCEPTABLE_PROTOCOL: Final = 0x01  # what a 3.1.1 broker answers an MQTT 5 CONNECT
BAD_USERNAME_OR_PASSWORD: Final = 0x86
NOT_AUTHORIZED: Final = 0x87
BAD_AUTHENTICATION_METHOD: Final = 0x8C
SESSION_TAKEN_OVER: Final = 0x8E
# CONNACK reason codes that retrying cannot fix; anything else not listed (server unavailable
# or busy, quota or rate exceeded, unspecified) is treated as transient.
_FATAL_CONNACK: Final = frozenset(
    {0x81, 0x82, 0x84, 0x85, 0x86, 0x87, 0x8A, 0x8C, 0x90, 0x95, 0x99, 0x9A, 0x9B, 0x9C, 0x9D}
)


# TLS alerts a broker sends when it does not accept the client certificate (OpenSSL's names).
_CLIENT_CERTIFICATE_REFUSED: Final = frozenset(
    {
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "TLSV1_ALERT_ACCESS_DENIED",
    }
)


class SessionError(Exception):
    """Base class of every error the session raises."""


class NotConnected(SessionError, ConnectionError):
    """The session has no connection to the broker (or lost it before the acknowledgement)."""


class LostInFlight(NotConnected):
    """The connection dropped after a QoS 1 publish went out and before its acknowledgement:
    the broker may have it, or not."""


class SessionTimeout(SessionError, TimeoutError):
    """A connect, publish, subscribe or unsubscribe did not complete within its timeout."""


class TlsHangUp(NotConnected):
    """The broker closed a TLS connection before CONNACK, without a TLS alert to say why: how
    a broker that refuses the client certificate, or its absence, can look from here."""

    def __init__(self, with_certificate: bool, names: SettingNames = own_names) -> None:
        cert_file = names("mqtt.tls.cert_file")
        hint = (
            f"does it accept the client certificate? see {cert_file}"
            if with_certificate
            else f"does it require a client certificate? see {cert_file}"
        )
        super().__init__(f"the broker closed the TLS connection before CONNACK ({hint})")


class TlsPortWithoutTls(NotConnected):
    """The broker hung up on a plain CONNECT, and its port answers a TLS handshake: the
    client was not set to use TLS. Retrying the same way cannot help."""

    def __init__(self, names: SettingNames = own_names) -> None:
        super().__init__(
            "the port speaks TLS, and this client connected without it: set "
            f"{names('mqtt.tls.enabled')} (and {names('mqtt.tls.ca_file')} for a CA of "
            "your own)"
        )


class ConnectFailed(SessionError, ConnectionError):
    """A connection attempt failed in a way that waiting will not soon change (nothing listens
    on the port, the host name does not resolve, the broker's certificate does not verify),
    and the session was started to give up on such failures (``start(fail_fast=True)``).
    ``failure`` is what the attempt raised."""

    def __init__(self, message: str, failure: BaseException | None = None) -> None:
        super().__init__(message)
        self.failure = failure


class ConnectionRefused(SessionError):
    """The broker answered CONNECT with a failure reason code."""

    def __init__(self, reason_code: int, message: str, *, fatal: bool) -> None:
        super().__init__(message)
        self.reason_code = reason_code
        self.fatal = fatal


class ProtocolVersionRefused(ConnectionRefused):
    """The broker does not accept MQTT 5. Fatal: the agent never falls back to MQTT 3.1.1."""


class AuthenticationFailed(ConnectionRefused):
    """The broker refused the credentials, the token or the client certificate. Fatal."""


class PublishFailed(SessionError):
    """The broker answered a QoS 1 PUBLISH with a failure reason code (>= 0x80)."""

    def __init__(self, topic: str, reason_code: int) -> None:
        super().__init__(f"the broker refused the publish to {topic!r}: {reason_name(reason_code)}")
        self.topic = topic
        self.reason_code = reason_code


class SubscribeFailed(SessionError):
    """The broker answered a SUBSCRIBE or UNSUBSCRIBE with a failure reason code (>= 0x80)."""

    def __init__(self, topic_filter: str, reason_code: int, *, unsubscribe: bool = False) -> None:
        verb = "unsubscribe from" if unsubscribe else "subscription to"
        super().__init__(
            f"the broker refused the {verb} {topic_filter!r}: {reason_name(reason_code)}"
        )
        self.topic_filter = topic_filter
        self.reason_code = reason_code


def reason_name(code: int) -> str:
    """``0x87 (not authorized)``."""
    return f"0x{code:02X} ({_REASON_NAMES.get(code, 'unknown reason')})"


def connack_error(
    code: int, *, token_auth: bool = False, names: SettingNames = own_names
) -> ConnectionRefused:
    """The error for a CONNACK refusing the connection with ``code``.

    ``token_auth``: the CONNECT carried a Kubernetes service account token (K8S-SAT), so a
    refusal of the credentials is a refusal of the token.
    """
    name = reason_name(code)
    if code in (UNSUPPORTED_PROTOCOL_VERSION, V311_UNACCEPTABLE_PROTOCOL):
        return ProtocolVersionRefused(
            code,
            f"the broker refused MQTT 5 (CONNACK {name}); the agent needs MQTT 5 and does not "
            "fall back to MQTT 3.1.1, which loses every message property",
            fatal=True,
        )
    if token_auth and code in (NOT_AUTHORIZED, BAD_AUTHENTICATION_METHOD, BAD_USERNAME_OR_PASSWORD):
        return AuthenticationFailed(
            code,
            f"the broker refused the token (CONNACK {name}); check {names('mqtt.sat_file')} "
            "(the service account token and its audience) and that the broker accepts K8S-SAT "
            "on this port",
            fatal=True,
        )
    if code in (BAD_USERNAME_OR_PASSWORD, NOT_AUTHORIZED, BAD_AUTHENTICATION_METHOD):
        return AuthenticationFailed(
            code,
            f"the broker refused the credentials (CONNACK {name}); check "
            f"{names('mqtt.username')}, {names('mqtt.password')} and the client certificate "
            f"({names('mqtt.tls.cert_file')})",
            fatal=True,
        )
    fatal = code in _FATAL_CONNACK or code < 0x80
    return ConnectionRefused(
        code, f"the broker refused the connection (CONNACK {name})", fatal=fatal
    )


def is_definitive(error: BaseException) -> bool:
    """Whether a failed connection attempt will fail the same way for a while.

    Nothing listening, an unknown host name, a certificate that does not verify and a TLS
    handshake the broker refuses (with an alert, or by hanging up before CONNACK) will not
    change within a command's timeout; a timeout, an unreachable network, a connection closed
    without TLS or a busy broker may.
    """
    if isinstance(error, ssl.SSLError):
        # An EOF in the handshake is a peer that went away, which may be a restart.
        return not isinstance(error, ssl.SSLEOFError | ssl.SSLZeroReturnError)
    return isinstance(
        error, ConnectionRefusedError | socket.gaierror | TlsHangUp | TlsPortWithoutTls
    )


# What OpenSSL makes of an answer that is not TLS: an MQTT packet read as a TLS record.
_NOT_TLS = frozenset(
    {"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE", "UNKNOWN_PROTOCOL"}
)


def is_not_tls(error: ssl.SSLError) -> bool:
    """Whether a handshake failed because the peer does not speak TLS: it answered with
    something else, or hung up."""
    if isinstance(error, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return True
    return (error.reason or "") in _NOT_TLS


def describe_connect_failure(error: BaseException, names: SettingNames = own_names) -> str:
    """A failed connection attempt in words an operator can act on (after "host:port: ")."""
    if isinstance(error, TlsPortWithoutTls):
        return str(error)
    if isinstance(error, ConnectionRefusedError):
        return "connection refused: nothing accepts connections there"
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the host name: {error.strerror or error}"
    if isinstance(error, ssl.SSLCertVerificationError):
        reason = error.verify_message or error.reason or str(error)
        return (
            f"TLS: the broker's certificate does not verify: {reason} "
            f"(check {names('mqtt.host')} and {names('mqtt.tls.ca_file')})"
        )
    if isinstance(error, ssl.SSLError):
        reason = error.reason or ""
        if reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
            return (
                "TLS: the broker requires a client certificate "
                f"(set {names('mqtt.tls.cert_file')} and {names('mqtt.tls.key_file')})"
            )
        if reason in _CLIENT_CERTIFICATE_REFUSED:
            return (
                "TLS: the broker refused the client certificate "
                f"({reason.replace('_', ' ').lower()}; check {names('mqtt.tls.cert_file')})"
            )
        if reason in _NOT_TLS:
            return f"TLS: the broker did not answer in TLS ({reason}: a port without TLS?)"
        return f"TLS: the handshake failed: {reason or error}"
    return describe(error)


def describe(error: BaseException | None) -> str:
    if error is None:
        return "none"
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def disconnect_detail(reason: int | None) -> str:
    """What to add to "lost its connection" for the DISCONNECT reason code, if any."""
    if reason is None:
        return ""
    if reason == SESSION_TAKEN_OVER:
        return " (DISCONNECT 0x8E: another client connected with the same client id)"
    return f" (DISCONNECT {reason_name(reason)})"
