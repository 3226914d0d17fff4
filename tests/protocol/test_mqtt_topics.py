"""MQTT topic names and filters: one set of rules for the client session and the broker."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent.emulator import mqtt_packets
from agent.protocol.mqtt_topics import (
    is_shared_subscription,
    is_valid_topic_filter,
    is_valid_topic_name,
    topic_filter_problem,
    topic_matches,
    topic_name_problem,
    validate_topic_filter,
    validate_topic_name,
)
from tests.support.examples import examples


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("a/b", "a/b/", False),
        ("A", "a", False),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/+", "a/", True),
        ("a/+", "a", False),
        ("a/+/c", "a//c", True),
        ("+/b", "a/b", True),
        ("+", "a", True),
        ("+", "a/b", False),
        ("+/+", "/", True),
        ("/+", "/a", True),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("a/#", "ab", False),
        ("a/#", "b", False),
        ("#", "a/b", True),
        ("#", "/", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/broker/log", True),
        ("$SYS/+", "$SYS/broker", True),
        ("$SYS", "$SYS", True),
        ("a/$x/#", "a/$x/y", True),
        ("+/$x", "a/$x", True),
        ("a/b/c", "a/b", False),
        ("a/b", "a/b/c", False),
        # Shared subscriptions match what follows $share/<group>/.
        ("$share/g/a/+", "a/b", True),
        ("$share/g/a/+", "b/b", False),
        ("$share/g/#", "$SYS/x", False),
        ("$share/g/a", "$share/g/a", False),
    ],
)
def test_topic_matches(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_matches(topic_filter, topic) is expected


level = st.text(alphabet="abc", max_size=3)


@given(st.lists(level, min_size=1, max_size=5), st.data())
def test_a_topic_matches_itself_and_wildcards(levels: list[str], data: st.DataObject) -> None:
    topic = "/".join(levels)
    assert topic_matches(topic, topic)
    assert topic_matches("#", topic)
    assert topic_matches(f"$share/group/{topic}", topic)
    index = data.draw(st.integers(0, len(levels) - 1))
    assert topic_matches("/".join([*levels[:index], "+", *levels[index + 1 :]]), topic)
    assert topic_matches("/".join([*levels[:index], "#"]), topic)


VALID_FILTERS = ["#", "+", "a/+/b", "a/#", "+/+", "/", "$SYS/#", "a//b", "$share/g/a/#", "ä/€"]
INVALID_FILTERS = [
    "",
    "a#",
    "a/#/b",
    "a+",
    "a/b+",
    "##",
    "#/",
    "a\x00b",
    "\ud800",  # a lone surrogate cannot be encoded, so cannot be sent
    "a" * 65_536,
    "$share/g",
    "$share//a",
    "$share/g/",
    "$share/g+/a",
    "$share/#/a",
    "$share/g/a/#/b",
]


@pytest.mark.parametrize("topic_filter", VALID_FILTERS)
def test_valid_filters(topic_filter: str) -> None:
    assert is_valid_topic_filter(topic_filter)
    assert topic_filter_problem(topic_filter) is None
    assert validate_topic_filter(topic_filter) == topic_filter


@pytest.mark.parametrize("topic_filter", INVALID_FILTERS)
def test_invalid_filters_say_why(topic_filter: str) -> None:
    assert not is_valid_topic_filter(topic_filter)
    with pytest.raises(ValueError, match=r"topic filter|shared subscription|'#'|'\+'"):
        validate_topic_filter(topic_filter)


VALID_NAMES = ["a", "/", "a/b", "$SYS/x", "ä/€", "a" * 65_535, "$share/g/a"]
INVALID_NAMES = ["", "a/+", "#", "a/#", "a\x00", "a" * 65_536, "\udc00", "a/\ud800/b"]


@pytest.mark.parametrize("topic", VALID_NAMES)
def test_valid_names(topic: str) -> None:
    assert is_valid_topic_name(topic) and topic_name_problem(topic) is None
    assert validate_topic_name(topic) == topic


@pytest.mark.parametrize("topic", INVALID_NAMES)
def test_invalid_names_say_why(topic: str) -> None:
    assert not is_valid_topic_name(topic)
    with pytest.raises(ValueError, match="topic"):
        validate_topic_name(topic)


def test_shared_subscriptions_are_recognised() -> None:
    assert is_shared_subscription("$share/group/a/b")
    assert not is_shared_subscription("$SYS/a")
    assert not is_shared_subscription("share/a")


def test_the_broker_codec_uses_the_same_functions() -> None:
    # One implementation: the broker's codec re-exports these, it has no copy of its own (so
    # tests/emulator/test_mqtt_packets.py, which checks matching against an independent
    # regex reading of the spec, checks these very functions).
    assert mqtt_packets.topic_matches is topic_matches
    assert mqtt_packets.is_valid_topic_name is is_valid_topic_name
    assert mqtt_packets.is_valid_topic_filter is is_valid_topic_filter
    assert mqtt_packets.is_shared_subscription is is_shared_subscription


def _reference_match(topic_filter: str, topic: str) -> bool:
    """An independent, regex-based reading of section 4.7."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    pattern = ""
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if level == "#":
            # "a/#" also matches "a": the separator before # is optional.
            pattern = pattern[: -len(re.escape("/"))] + "(/.*)?" if index else ".*"
            break
        pattern += "[^/]*" if level == "+" else re.escape(level)
        if index < len(levels) - 1:
            pattern += re.escape("/")
    return re.fullmatch(pattern, topic, re.DOTALL) is not None


topic_levels = st.sampled_from(["a", "b", "", "$s", "ab"])
filter_levels = st.sampled_from(["a", "b", "", "$s", "+"])


@given(
    st.lists(filter_levels, min_size=1, max_size=4),
    st.booleans(),
    st.lists(topic_levels, min_size=1, max_size=5),
)
@pytest.mark.thorough
@settings(max_examples=examples(500, 150))
def test_topic_matches_agrees_with_a_reference(
    levels: list[str], multi_level: bool, topic_parts: list[str]
) -> None:
    topic_filter = "/".join([*levels, "#"] if multi_level else levels)
    topic = "/".join(topic_parts)
    assume(topic_filter and topic)  # both must be non-empty to be valid
    assert is_valid_topic_filter(topic_filter)
    assert is_valid_topic_name(topic)
    assert topic_matches(topic_filter, topic) == _reference_match(topic_filter, topic)
