"""Authorization rules and authentication, pure: parsing, matching, and their refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.emulator import mqtt_packets as mp
from agent.emulator.authn import Authenticator, CredentialsError, TokenFile, parse_users
from agent.emulator.authz import (
    Access,
    AuthorizationRules,
    ClientIdentity,
    RulesError,
    filter_covers,
    parse_rules,
)
from agent.protocol import topics

RULES: dict[str, Any] = {
    "rules": [
        {
            "principals": {"clientIds": ["gw-*"], "usernames": ["ops"]},
            "brokerResources": [
                {"method": "Connect"},
                {"method": "Publish", "topics": ["telemetry/{principal.clientId}"]},
                {"method": "Subscribe", "topics": ["clients/{principal.clientId}/#", "cmd/+"]},
            ],
            "stateStoreResources": [
                {"keyType": "Pattern", "keys": ["line1/*"], "method": "ReadWrite"},
                {"keyType": "String", "keys": ["config"], "method": "Read"},
                {"keyType": "Pattern", "keys": ["own/{principal.clientId}/*"], "method": "Write"},
                {"keyType": "Binary", "keys": ["AP8="], "method": "ReadWrite"},
            ],
        },
        {
            "principals": {"certificateSubjects": ["CN=viewer,O=plant"]},
            "brokerResources": [{"method": "Connect"}],
            "stateStoreResources": [{"keyType": "Pattern", "keys": ["*"], "method": "Read"}],
        },
    ]
}


@pytest.fixture
def rules() -> AuthorizationRules:
    return parse_rules(json.dumps(RULES))


GW = ClientIdentity("gw-1")
OPS = ClientIdentity("laptop", username="ops")
STRANGER = ClientIdentity("stranger", username="nobody")
VIEWER = ClientIdentity("any", certificate_subject="CN=viewer,O=plant")


def test_principals_match_any_of_client_id_user_or_subject(rules: AuthorizationRules) -> None:
    assert rules.may_connect(GW)
    assert rules.may_connect(OPS)
    assert rules.may_connect(VIEWER)
    assert not rules.may_connect(STRANGER)
    assert not rules.may_connect(ClientIdentity("gw", certificate_subject="CN=viewer"))


def test_keys_by_pattern_string_and_binary(rules: AuthorizationRules) -> None:
    for who in (GW, OPS):
        assert rules.may_access_key(who, b"line1/dev1\\setPoint", Access.WRITE)
        assert rules.may_access_key(who, b"line1/dev1\\setPoint", Access.READ)
        assert rules.may_access_key(who, b"config", Access.READ)
        assert not rules.may_access_key(who, b"config", Access.WRITE)
        assert not rules.may_access_key(who, b"line2/x", Access.READ)
        assert rules.may_access_key(who, b"\x00\xff", Access.WRITE)
    assert not rules.may_access_key(GW, b"configs", Access.READ)  # String is exact
    assert rules.may_access_key(GW, b"own/gw-1/x", Access.WRITE)
    assert not rules.may_access_key(GW, b"own/gw-1/x", Access.READ)  # Write only
    assert not rules.may_access_key(GW, b"own/gw-2/x", Access.WRITE)
    assert rules.may_access_key(VIEWER, b"anything at all", Access.READ)
    assert not rules.may_access_key(VIEWER, b"line1/x", Access.WRITE)
    assert not rules.may_access_key(STRANGER, b"line1/x", Access.READ)


def test_topics(rules: AuthorizationRules) -> None:
    assert rules.may_publish(GW, "telemetry/gw-1")
    assert not rules.may_publish(GW, "telemetry/gw-2")
    assert rules.may_subscribe(GW, "clients/gw-1/#")
    assert rules.may_subscribe(GW, "clients/gw-1/services/x/response")
    assert not rules.may_subscribe(GW, "clients/#")
    assert not rules.may_subscribe(GW, "clients/+/x")
    assert rules.may_subscribe(GW, "cmd/a")
    assert rules.may_subscribe(GW, "cmd/+")
    assert not rules.may_subscribe(GW, "cmd/#")
    assert not rules.may_publish(VIEWER, "telemetry/any")


def test_the_state_store_topics_need_no_topic_grant(rules: AuthorizationRules) -> None:
    """Each request is checked against the key rules instead."""
    assert rules.may_publish(VIEWER, topics.INVOKE_TOPIC)
    assert rules.may_subscribe(VIEWER, topics.notify_filter("any"))
    assert not rules.may_subscribe(VIEWER, topics.notify_filter("someone-else"))
    assert not rules.may_subscribe(VIEWER, "clients/statestore/#")


def test_a_request_is_answered_only_where_its_client_may_publish(
    rules: AuthorizationRules,
) -> None:
    invoke = topics.INVOKE_TOPIC
    assert rules.may_publish(GW, invoke, topics.response_topic("gw-1"))  # its own space
    assert rules.may_publish(GW, invoke, "telemetry/gw-1")  # a Publish grant
    assert not rules.may_publish(GW, invoke, topics.response_topic("gw-2"))
    assert not rules.may_publish(GW, invoke, "gateways/line1/health")
    assert not rules.may_publish(VIEWER, invoke, "telemetry/any")
    # A client id that is not a whole topic level has no space of its own.
    assert not rules.may_publish(ClientIdentity("gw-a/b"), invoke, "clients/gw-a/b/x")
    assert not rules.may_publish(ClientIdentity("gw-+"), invoke, "clients/gw-+/x")


@pytest.mark.parametrize("client_id", ["+", "#", "gw-a/b", "gw-+"])
def test_a_client_id_with_wildcards_widens_no_topic_grant(
    rules: AuthorizationRules, client_id: str
) -> None:
    who = ClientIdentity(client_id)
    assert not rules.may_publish(who, "telemetry/gw-1")
    assert not rules.may_subscribe(who, "clients/gw-1/#")


def test_a_client_id_with_glob_characters_widens_no_key_grant(rules: AuthorizationRules) -> None:
    sneaky = ClientIdentity("gw-*")
    assert rules.may_access_key(sneaky, b"own/gw-*/x", Access.WRITE)
    assert not rules.may_access_key(sneaky, b"own/gw-1/x", Access.WRITE)


def test_username_tokens_need_a_username() -> None:
    rules = parse_rules(
        json.dumps(
            {
                "rules": [
                    {
                        "principals": {"clientIds": ["*"]},
                        "stateStoreResources": [
                            {
                                "keyType": "String",
                                "keys": ["u/{principal.username}"],
                                "method": "Read",
                            }
                        ],
                    }
                ]
            }
        )
    )
    assert rules.may_access_key(ClientIdentity("c", "al"), b"u/al", Access.READ)
    assert not rules.may_access_key(ClientIdentity("c"), b"u/", Access.READ)


def test_the_resource_nesting_of_the_real_broker_is_accepted() -> None:
    nested = {"authorizationPolicies": {"cache": "Enabled", "rules": RULES["rules"]}}
    assert parse_rules(json.dumps(nested)).may_connect(GW)


@pytest.mark.parametrize(
    ("document", "names"),
    [
        ("[", "not JSON"),
        ({"rules": {}}, "rules: expected a list"),
        ({"rules": [{"principals": {}}]}, "rules[0].principals: name at least one"),
        ({"rules": [{"principals": {"clientIds": "a"}}]}, "rules[0].principals.clientIds"),
        ({"rules": [{"principals": {"attributes": [{}]}}]}, "attributes: not supported"),
        (
            {"rules": [{"principals": {"clientIds": ["a"]}, "brokerResources": [{"method": "X"}]}]},
            "rules[0].brokerResources[0].method",
        ),
        (
            {
                "rules": [
                    {
                        "principals": {"clientIds": ["a"]},
                        "brokerResources": [{"method": "Publish", "topics": ["a/#/b"]}],
                    }
                ]
            },
            "'a/#/b' is not a valid topic filter",
        ),
        (
            {
                "rules": [
                    {
                        "principals": {"clientIds": ["a"]},
                        "brokerResources": [
                            {"method": "Publish", "topics": ["x-{principal.clientId}"]}
                        ],
                    }
                ]
            },
            "is not a valid topic filter",
        ),
        (
            {
                "rules": [
                    {
                        "principals": {"clientIds": ["a"]},
                        "stateStoreResources": [
                            {"keyType": "Pattern", "keys": ["k"], "method": "W"}
                        ],
                    }
                ]
            },
            "rules[0].stateStoreResources[0].method: expected Read, Write or ReadWrite",
        ),
        (
            {
                "rules": [
                    {
                        "principals": {"clientIds": ["a"]},
                        "stateStoreResources": [
                            {"keyType": "Binary", "keys": ["!!"], "method": "Read"}
                        ],
                    }
                ]
            },
            "Binary keys are base64",
        ),
        ({"rules": [], "extra": 1}, "unknown fields ['extra']"),
    ],
)
def test_rules_that_make_no_sense_name_the_field(document: Any, names: str) -> None:
    text = document if isinstance(document, str) else json.dumps(document)
    with pytest.raises(RulesError, match=None) as caught:
        parse_rules(text)
    assert names in str(caught.value)


topic_level = st.sampled_from(["a", "b", "+", "#"])


@given(st.lists(topic_level, min_size=1, max_size=4), st.lists(topic_level, min_size=1, max_size=4))
def test_filter_covers_agrees_with_matching(granted: list[str], requested: list[str]) -> None:
    granted_filter, requested_filter = "/".join(granted), "/".join(requested)
    if not (
        mp.is_valid_topic_filter(granted_filter) and mp.is_valid_topic_filter(requested_filter)
    ):
        return
    if filter_covers(granted_filter, requested_filter):
        # Every topic the requested filter matches, the granted one matches too.
        for levels in range(1, 6):
            for topic in _topics(levels):
                if mp.topic_matches(requested_filter, topic):
                    assert mp.topic_matches(granted_filter, topic), (topic, granted, requested)


def _topics(levels: int) -> list[str]:
    names = [""]
    for _ in range(levels):
        names = [f"{n}/{x}" if n else x for n in names for x in ("a", "b", "c")]
    return names


# ---------------------------------------------------------------------------- authentication


def _connect(**options: Any) -> mp.Connect:
    return mp.Connect("c", **options)


def test_users_and_passwords() -> None:
    users = parse_users('{"alice": "s3cret"}')
    auth = Authenticator(users=users)
    ok = mp.ReasonCode.SUCCESS
    bad = mp.ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert auth.authenticate(_connect(username="alice", password=b"s3cret"), None) == ok
    assert auth.authenticate(_connect(username="alice", password=b"wrong"), None) == bad
    assert auth.authenticate(_connect(username="alice"), None) == bad
    assert auth.authenticate(_connect(username="bob", password=b"s3cret"), None) == bad
    assert auth.authenticate(_connect(), None) == mp.ReasonCode.NOT_AUTHORIZED
    assert auth.authenticate(_connect(), "CN=gw") == ok  # a verified client certificate


@pytest.mark.parametrize("text", ["", "[]", "{}", '{"a": ""}', '{"a": 1}', "{"])
def test_unusable_users_files_are_refused_without_the_passwords(text: str) -> None:
    with pytest.raises(CredentialsError) as caught:
        parse_users(text, "users.json")
    assert "users.json" in str(caught.value)


def test_k8s_sat_tokens_from_a_file_are_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# accepted\ntoken-one\n\n")
    auth = Authenticator(tokens=TokenFile(path))

    def sat(token: bytes | None, method: str = "K8S-SAT") -> int:
        props = mp.Properties(authentication_method=method, authentication_data=token)
        return auth.authenticate(_connect(properties=props), None)

    assert sat(b"token-one") == mp.ReasonCode.SUCCESS
    assert sat(b"token-two") == mp.ReasonCode.NOT_AUTHORIZED
    assert sat(None) == mp.ReasonCode.NOT_AUTHORIZED
    assert sat(b"token-one", "SCRAM-SHA-256") == mp.ReasonCode.BAD_AUTHENTICATION_METHOD
    path.write_text("token-two\n")
    os.utime(path, ns=(1, 1))  # a different modification time, whatever the clock's grain
    assert sat(b"token-two") == mp.ReasonCode.SUCCESS
    assert sat(b"token-one") == mp.ReasonCode.NOT_AUTHORIZED
    # Without credentials of any kind, nobody gets in once tokens are required.
    assert auth.authenticate(_connect(), None) == mp.ReasonCode.NOT_AUTHORIZED


def test_k8s_sat_tokens_from_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("token-a\n")
    (tmp_path / "b").write_text("token-b")
    tokens = TokenFile(tmp_path)
    assert tokens.accepts(b"token-a") and tokens.accepts(b"token-b")
    (tmp_path / "b").unlink()
    assert not tokens.accepts(b"token-b")


def test_without_any_credentials_configured_sat_is_an_unknown_method() -> None:
    props = mp.Properties(authentication_method="K8S-SAT", authentication_data=b"t")
    assert (
        Authenticator().authenticate(_connect(properties=props), None)
        == mp.ReasonCode.BAD_AUTHENTICATION_METHOD
    )
    assert Authenticator().authenticate(_connect(username="x"), None) == mp.ReasonCode.SUCCESS
