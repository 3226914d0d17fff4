"""Authorization rules, as the real broker's BrokerAuthorization offers them. Pure.

A rule names principals (client ids, user names, certificate subjects: any one matching is
enough) and grants them broker methods on topics (Connect, Publish, Subscribe) and state
store methods on keys (Read, Write, ReadWrite). Allow-only: what no rule grants is refused.
The file format is JSON, the shape of the real resource (see the README):

    {"rules": [{"principals": {"clientIds": ["gw-*"]},
                "brokerResources": [
                    {"method": "Connect"},
                    {"method": "Subscribe", "topics": ["clients/{principal.clientId}/#"]}],
                "stateStoreResources": [
                    {"keyType": "Pattern", "keys": ["line1/*"], "method": "ReadWrite"}]}]}

`{principal.clientId}` and `{principal.username}` in topics and keys stand for the client's
own; in a topic such a token must be a whole level. Principals and `Pattern` keys take `*`
(any run of characters) and `?` (one character), as globs do; topics take MQTT wildcards.

The state store's own topics are not governed by topic rules: publishing requests to the
invoke topic and subscribing to one's own notification topics are always allowed, since
each request is then checked against the key rules. The store publishes its answer on the
request's response topic for the requester, so only where the requester could publish
itself: under a Publish grant, or in its own ``clients/{clientId}/`` space (a client id
that is not a whole topic level has none). To get the answer it needs a Subscribe grant
there too, like any other topic.
"""

from __future__ import annotations

import base64
import binascii
import enum
import fnmatch
import glob
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.emulator import mqtt_packets as mp
from agent.protocol import topics


class Access(enum.Enum):
    """What a state store request does to its key."""

    READ = "read"  # GET, KEYNOTIFY
    WRITE = "write"  # SET, DEL, VDEL


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    """Who a connected client is: what the rules' principals are matched against."""

    client_id: str
    username: str | None = None
    certificate_subject: str | None = None


class RulesError(ValueError):
    """The rules file does not make sense; the message names the offending field."""


_METHODS = {"read": {Access.READ}, "write": {Access.WRITE}, "readwrite": set(Access)}
_BROKER_METHODS = ("connect", "publish", "subscribe")
_TOKEN = re.compile(r"\{principal\.(clientId|username)\}")


def _glob(pattern: str) -> Callable[[str], bool]:
    if "*" not in pattern and "?" not in pattern and "[" not in pattern:
        return pattern.__eq__
    return lambda text: fnmatch.fnmatchcase(text, pattern)


def _substitute(
    text: str, identity: ClientIdentity, quote: Callable[[str], str | None] = str
) -> str | None:
    """`text` with the identity's tokens put in, each through ``quote``.

    None when a token names a missing user name or ``quote`` refuses a value: a client
    must not widen a grant by choosing an id with wildcards in it.
    """
    refused = False

    def value(match: re.Match[str]) -> str:
        nonlocal refused
        raw = identity.client_id if match.group(1) == "clientId" else identity.username
        quoted = None if raw is None else quote(raw)
        if quoted is None:
            refused = True
            return ""
        return quoted

    result = _TOKEN.sub(value, text)
    return None if refused else result


def _topic_level(value: str) -> str | None:
    return None if not value or any(c in value for c in "+#/") else value


def _glob_literal(value: str) -> str:
    return glob.escape(value)


@dataclass(frozen=True, slots=True)
class _Principals:
    client_ids: tuple[str, ...] = ()
    usernames: tuple[str, ...] = ()
    certificate_subjects: tuple[str, ...] = ()

    def match(self, identity: ClientIdentity) -> bool:
        if any(_glob(p)(identity.client_id) for p in self.client_ids):
            return True
        if identity.username is not None and any(
            _glob(p)(identity.username) for p in self.usernames
        ):
            return True
        subject = identity.certificate_subject
        return subject is not None and any(_glob(p)(subject) for p in self.certificate_subjects)


@dataclass(frozen=True, slots=True)
class _KeyGrant:
    kind: str  # "pattern", "string" or "binary"
    keys: tuple[str | bytes, ...]
    access: frozenset[Access]

    def match(self, identity: ClientIdentity, key: bytes, access: Access) -> bool:
        if access not in self.access:
            return False
        for wanted in self.keys:
            if isinstance(wanted, bytes):
                if wanted == key:
                    return True
                continue
            quote = str if self.kind == "string" else _glob_literal
            resolved = _substitute(wanted, identity, quote)
            if resolved is None:
                continue
            if self.kind == "string":
                if resolved.encode() == key:
                    return True
            # Glob over bytes: latin-1 maps each byte to one character and back.
            elif fnmatch.fnmatchcase(key.decode("latin-1"), resolved.encode().decode("latin-1")):
                return True
        return False


@dataclass(frozen=True, slots=True)
class _Rule:
    principals: _Principals
    connect: bool = False
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    keys: tuple[_KeyGrant, ...] = ()


@dataclass(frozen=True, slots=True)
class AuthorizationRules:
    """The rules of one file; ``may_*`` answer for one client and one resource."""

    rules: tuple[_Rule, ...] = field(default_factory=tuple)

    def _for(self, identity: ClientIdentity) -> list[_Rule]:
        return [rule for rule in self.rules if rule.principals.match(identity)]

    def may_connect(self, identity: ClientIdentity) -> bool:
        return any(rule.connect for rule in self._for(identity))

    def may_publish(
        self, identity: ClientIdentity, topic: str, response_topic: str | None = None
    ) -> bool:
        """Whether the client may publish to ``topic``; a request to the store (``topic`` is
        its invoke topic) also needs a ``response_topic`` the client may have answers on."""
        if topic == topics.INVOKE_TOPIC:
            return response_topic is None or self.may_be_answered_on(identity, response_topic)
        return self._granted_publish(identity, topic)

    def may_be_answered_on(self, identity: ClientIdentity, response_topic: str) -> bool:
        """Whether the store may publish its answers to this client on ``response_topic``."""
        own = _topic_level(identity.client_id)
        if own is not None and mp.topic_matches(f"clients/{own}/#", response_topic):
            return True
        return self._granted_publish(identity, response_topic)

    def _granted_publish(self, identity: ClientIdentity, topic: str) -> bool:
        return any(
            _topic_pattern_matches(pattern, identity, topic, mp.topic_matches)
            for rule in self._for(identity)
            for pattern in rule.publish
        )

    def may_subscribe(self, identity: ClientIdentity, topic_filter: str) -> bool:
        own_notifications = topics.notify_filter(identity.client_id)
        if filter_covers(own_notifications, topic_filter):
            return True
        return any(
            _topic_pattern_matches(pattern, identity, topic_filter, filter_covers)
            for rule in self._for(identity)
            for pattern in rule.subscribe
        )

    def named_users(self) -> list[str]:
        """The user names the rules grant to, and ``{principal.username}`` if they use it."""
        names: list[str] = []
        for rule in self.rules:
            names += rule.principals.usernames
            patterns = [*rule.publish, *rule.subscribe]
            patterns += [k for grant in rule.keys for k in grant.keys if isinstance(k, str)]
            if any("{principal.username}" in pattern for pattern in patterns):
                names.append("{principal.username}")
        return sorted(set(names))

    def may_access_key(self, identity: ClientIdentity, key: bytes, access: Access) -> bool:
        return any(
            grant.match(identity, key, access)
            for rule in self._for(identity)
            for grant in rule.keys
        )


def _topic_pattern_matches(
    pattern: str,
    identity: ClientIdentity,
    topic: str,
    matches: Callable[[str, str], bool],
) -> bool:
    resolved = _substitute(pattern, identity, _topic_level)
    return resolved is not None and matches(resolved, topic)


def filter_covers(granted: str, requested: str) -> bool:
    """Whether every topic that ``requested`` matches is matched by ``granted`` too."""
    granted_levels = granted.split("/")
    requested_levels = requested.split("/")
    for index, level in enumerate(granted_levels):
        if level == "#":
            return True
        if index >= len(requested_levels):
            return False
        wanted = requested_levels[index]
        if wanted == "#":
            return False
        if level == "+":
            continue
        if wanted == "+" or wanted != level:
            return False
    return len(granted_levels) == len(requested_levels)


# ------------------------------------------------------------------------------- parsing


def parse_rules(text: str) -> AuthorizationRules:
    """The rules in a JSON document; RulesError names the field that is wrong."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RulesError(f"not JSON: {exc}") from None
    if isinstance(document, Mapping) and "authorizationPolicies" in document:
        document = document["authorizationPolicies"]  # the resource's own nesting
        where = "authorizationPolicies.rules"
    else:
        where = "rules"
    if not isinstance(document, Mapping) or not isinstance(document.get("rules"), list):
        raise RulesError(f"{where}: expected a list of rules")
    unknown = set(document) - {"rules", "cache"}
    if unknown:
        raise RulesError(f"unknown fields {sorted(unknown)}")
    return AuthorizationRules(
        tuple(_parse_rule(rule, f"{where}[{i}]") for i, rule in enumerate(document["rules"]))
    )


def _object(value: Any, where: str, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RulesError(f"{where}: expected an object")
    unknown = set(value) - allowed
    if unknown:
        raise RulesError(f"{where}: unknown fields {sorted(unknown)}")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RulesError(f"{where}: expected a list of non-empty strings")
    return tuple(value)


def _parse_rule(value: Any, where: str) -> _Rule:
    rule = _object(value, where, {"principals", "brokerResources", "stateStoreResources"})
    principals = _object(
        rule.get("principals"),
        f"{where}.principals",
        {"clientIds", "usernames", "certificateSubjects", "attributes"},
    )
    if "attributes" in principals:
        raise RulesError(f"{where}.principals.attributes: not supported by the emulator")
    parsed = _Principals(
        *(
            _strings(principals.get(name, []), f"{where}.principals.{name}")
            for name in ("clientIds", "usernames", "certificateSubjects")
        )
    )
    if not (parsed.client_ids or parsed.usernames or parsed.certificate_subjects):
        raise RulesError(f"{where}.principals: name at least one client id, user or subject")
    connect = False
    grants: dict[str, list[str]] = {"publish": [], "subscribe": []}
    for index, resource in enumerate(_list(rule.get("brokerResources", []), where)):
        here = f"{where}.brokerResources[{index}]"
        resource = _object(resource, here, {"method", "topics"})
        method = str(resource.get("method", "")).lower()
        if method not in _BROKER_METHODS:
            raise RulesError(f"{here}.method: expected Connect, Publish or Subscribe")
        if method == "connect":
            if "topics" in resource:
                raise RulesError(f"{here}.topics: Connect takes no topics")
            connect = True
            continue
        for topic in _strings(resource.get("topics"), f"{here}.topics"):
            if not mp.is_valid_topic_filter(topic) or not _tokens_are_levels(topic):
                raise RulesError(f"{here}.topics: {topic!r} is not a valid topic filter")
            grants[method].append(topic)
    keys = tuple(
        _parse_key_grant(resource, f"{where}.stateStoreResources[{index}]")
        for index, resource in enumerate(_list(rule.get("stateStoreResources", []), where))
    )
    return _Rule(parsed, connect, tuple(grants["publish"]), tuple(grants["subscribe"]), keys)


def _list(value: Any, where: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise RulesError(f"{where}: expected a list")
    return value


def _tokens_are_levels(topic: str) -> bool:
    return all(
        _TOKEN.fullmatch(level) is not None for level in topic.split("/") if _TOKEN.search(level)
    )


def _parse_key_grant(value: Any, where: str) -> _KeyGrant:
    resource = _object(value, where, {"keyType", "keys", "method"})
    kind = str(resource.get("keyType", "")).lower()
    if kind not in ("pattern", "string", "binary"):
        raise RulesError(f"{where}.keyType: expected Pattern, String or Binary")
    method = str(resource.get("method", "")).lower()
    if method not in _METHODS:
        raise RulesError(f"{where}.method: expected Read, Write or ReadWrite")
    keys: tuple[str | bytes, ...] = _strings(resource.get("keys"), f"{where}.keys")
    if kind == "binary":
        try:
            keys = tuple(base64.b64decode(k, validate=True) for k in keys)
        except (binascii.Error, ValueError):
            raise RulesError(f"{where}.keys: Binary keys are base64") from None
    return _KeyGrant(kind, keys, frozenset(_METHODS[method]))
