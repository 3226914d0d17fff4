"""Who may connect to the embedded broker: user names and passwords, K8S-SAT tokens.

With neither configured (and no client certificates required), every client may connect, as
before. With either, a client must prove who it is by one of them (or by a verified client
certificate): a wrong password gets CONNACK 0x86, no credentials or a token not on the list
0x87, an authentication method other than ``K8S-SAT`` 0x8C.

A user name is a principal (what authorization rules match) only when the client proved it
with its password: a K8S-SAT token proves a service account, not the user name beside it.
With nothing configured, nothing is proven and the name a client claims is taken as it is.

Passwords and tokens are secrets: they are never logged, and errors name only the file.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.emulator import mqtt_packets as mp
from agent.emulator.mqtt_packets import ReasonCode

log = logging.getLogger(__name__)

SAT_METHOD = "K8S-SAT"
"""MQTT 5 enhanced authentication with a Kubernetes service account token."""


class CredentialsError(ValueError):
    """A users or tokens file that cannot be used; the message names the file, not secrets."""


def parse_users(text: str, source: str = "users file") -> dict[str, bytes]:
    """``{"user": "password", ...}`` as JSON; passwords as UTF-8 bytes."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CredentialsError(f"{source}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(document, Mapping) or not document:
        raise CredentialsError(f'{source}: expected an object {{"user": "password", ...}}')
    users: dict[str, bytes] = {}
    for name, password in document.items():
        if not name or not isinstance(password, str) or not password:
            raise CredentialsError(f"{source}: user {name!r} needs a non-empty password")
        users[name] = password.encode()
    return users


def load_users(path: Path) -> dict[str, bytes]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CredentialsError(f"{path}: {exc.strerror or exc}") from None
    return parse_users(text, str(path))


def parse_tokens(text: str) -> frozenset[bytes]:
    """One token a line; blank lines and lines starting with '#' are ignored."""
    lines = (line.strip() for line in text.splitlines())
    return frozenset(line.encode() for line in lines if line and not line.startswith("#"))


class TokenFile:
    """The accepted K8S-SAT tokens: a file (one a line) or a directory (one a file).

    Read again whenever the file, the directory or a file in it changes (checked on each
    K8S-SAT connect), so tokens can be rotated without a restart.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._signature: tuple[tuple[str, int, int], ...] | None = None
        self._tokens: frozenset[bytes] = frozenset()
        self.refresh(strict=True)

    def _files(self) -> list[Path]:
        if self.path.is_dir():
            return sorted(
                entry
                for entry in self.path.iterdir()
                if entry.is_file() and not entry.name.startswith(".")
            )
        return [self.path]

    def refresh(self, *, strict: bool = False) -> None:
        try:
            files = self._files()
            stats = [(str(f), *_stamp(f.stat())) for f in files]
            signature = tuple(stats)
            if signature == self._signature:
                return
            if self.path.is_dir():
                tokens = frozenset(token for f in files if (token := f.read_bytes().strip()))
            else:
                tokens = parse_tokens(self.path.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            if strict:
                raise CredentialsError(f"{self.path}: cannot read the tokens: {exc}") from None
            log.warning("cannot read the tokens in %s (keeping the last ones): %s", self.path, exc)
            return
        if strict and not tokens:
            raise CredentialsError(f"{self.path}: no tokens in it")
        if self._signature is not None:
            log.info("tokens in %s reloaded: %d accepted", self.path, len(tokens))
        self._signature = signature
        self._tokens = tokens

    def accepts(self, token: bytes) -> bool:
        self.refresh()
        token = token.strip()
        # Compare against every token, so the time taken does not tell which one was close.
        found = False
        for accepted in self._tokens:
            found |= hmac.compare_digest(accepted, token)
        return found


def _stamp(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_mtime_ns, stat.st_size


@dataclass(frozen=True, slots=True)
class Authenticator:
    """Decides each CONNECT: a reason code, SUCCESS to let it in."""

    users: Mapping[str, bytes] | None = None
    tokens: TokenFile | None = None

    def authenticate(self, connect: mp.Connect, certificate_subject: str | None) -> int:
        method = connect.properties.authentication_method
        if method is not None:
            if method != SAT_METHOD or self.tokens is None:
                return ReasonCode.BAD_AUTHENTICATION_METHOD
            data = connect.properties.authentication_data
            if data is None or not self.tokens.accepts(data):
                return ReasonCode.NOT_AUTHORIZED
            return ReasonCode.SUCCESS
        if self.users is None and self.tokens is None:
            return ReasonCode.SUCCESS  # nothing to check against: anyone may connect
        if connect.username is not None:
            expected = None if self.users is None else self.users.get(connect.username)
            given = connect.password or b""
            # Compared even for an unknown user, so the time taken does not tell users apart.
            matches = hmac.compare_digest(expected or b"\0" + given, given)
            if expected is None or not matches:
                return ReasonCode.BAD_USER_NAME_OR_PASSWORD
            return ReasonCode.SUCCESS
        if certificate_subject is not None:
            return ReasonCode.SUCCESS
        return ReasonCode.NOT_AUTHORIZED

    def principal_username(self, connect: mp.Connect) -> str | None:
        """The user name of an accepted CONNECT that rules may match: one its password proves.

        Without users and tokens nothing is checked, and the name the client claims counts.
        """
        if self.users is None and self.tokens is None:
            return connect.username
        if connect.username is None or self.users is None:
            return None
        expected = self.users.get(connect.username)
        given = connect.password or b""
        if expected is not None and hmac.compare_digest(expected, given):
            return connect.username
        return None
