from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.protocol.topics import (
    INVOKE_TOPIC,
    is_forbidden_response_topic,
    key_from_notify_topic,
    notify_filter,
    notify_topic,
    response_topic,
)

PREFIX = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8"


def test_invoke_topic() -> None:
    assert INVOKE_TOPIC == "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"


def test_notify_topic_example() -> None:
    assert notify_topic("client-id1", b"SOMEKEY") == (
        f"{PREFIX}/636C69656E742D696431/command/notify/534F4D454B4559"
    )
    assert notify_filter("client-id1") == f"{PREFIX}/636C69656E742D696431/command/notify/+"


def test_hex_is_upper_case() -> None:
    assert notify_topic("\xff", b"\xab\xcd").endswith("/command/notify/ABCD")


@given(st.text(max_size=10), st.binary(min_size=1, max_size=20))
def test_key_round_trips_through_the_topic(client: str, key: bytes) -> None:
    assert key_from_notify_topic(notify_topic(client, key)) == key


def test_key_from_other_topics() -> None:
    assert key_from_notify_topic("a/b/c") is None
    assert key_from_notify_topic(f"{PREFIX}/00/command/notify/zz") is None
    assert key_from_notify_topic(f"{PREFIX}/00/command/notify/ab") is None  # lower case


def test_forbidden_response_topics() -> None:
    assert is_forbidden_response_topic(INVOKE_TOPIC)
    assert is_forbidden_response_topic(PREFIX)
    assert is_forbidden_response_topic(PREFIX + "/x/command/notify/00")
    assert not is_forbidden_response_topic(response_topic("c1"))
    assert response_topic("c1") == "clients/c1/services/statestore/_any_/command/invoke/response"
