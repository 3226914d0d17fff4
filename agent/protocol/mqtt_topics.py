"""MQTT 5 topic names and topic filters: validation and matching (sections 4.7 and 4.8.2).

Pure functions of strings, shared by the client session and the embedded broker, so that both
sides agree on what is valid and what matches:

- A topic name (what a PUBLISH carries) is non-empty, has no wildcard, no U+0000, no lone
  surrogate (it could not be encoded as UTF-8) and at most 65,535 bytes of UTF-8.
- A topic filter (what a SUBSCRIBE carries) follows the same string rules; ``+`` stands alone
  as a level, ``#`` stands alone as the last level.
- A shared subscription is ``$share/<group>/<filter>``: the group is non-empty and has no
  wildcard, the filter is a valid (non-empty) filter. It matches what ``<filter>`` matches: the
  broker hands each message to one member of the group.
- A filter starting with a wildcard does not match a topic starting with ``$`` ($SYS, ...).
"""

from __future__ import annotations

from typing import Final

MAX_TOPIC_BYTES: Final = 65_535
SHARE_PREFIX: Final = "$share/"


def topic_name_problem(topic: str) -> str | None:
    """Why ``topic`` cannot be published to, or None when it is a valid topic name."""
    if not topic:
        return "topic must not be empty"
    if "+" in topic or "#" in topic:
        return f"topic {topic!r} must not contain wildcards"
    return _string_problem("topic", topic)


def topic_filter_problem(topic_filter: str) -> str | None:
    """Why ``topic_filter`` cannot be subscribed to, or None when it is a valid filter."""
    if not topic_filter:
        return "topic filter must not be empty"
    problem = _string_problem("topic filter", topic_filter)
    if problem is not None:
        return problem
    body = topic_filter
    if topic_filter.startswith(SHARE_PREFIX):
        parts = topic_filter.split("/", 2)
        if len(parts) < 3 or not parts[1] or "+" in parts[1] or "#" in parts[1] or not parts[2]:
            return f"shared subscription {topic_filter!r} is not $share/<group>/<filter>"
        body = parts[2]
    levels = body.split("/")
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != last):
            return f"'#' must be the whole last level in {topic_filter!r}"
        if "+" in level and level != "+":
            return f"'+' must be a whole level in {topic_filter!r}"
    return None


def _string_problem(what: str, text: str) -> str | None:
    if "\x00" in text:
        return f"{what} {text!r} contains U+0000"
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return f"{what} {text!r} is not valid UTF-8 (lone surrogate)"
    if size > MAX_TOPIC_BYTES:
        return f"{what} is longer than {MAX_TOPIC_BYTES} bytes"
    return None


def is_valid_topic_name(topic: str) -> bool:
    return topic_name_problem(topic) is None


def is_valid_topic_filter(topic_filter: str) -> bool:
    return topic_filter_problem(topic_filter) is None


def validate_topic_name(topic: str) -> str:
    """Return ``topic``; raise ValueError saying why unless it is a valid topic name."""
    problem = topic_name_problem(topic)
    if problem is not None:
        raise ValueError(problem)
    return topic


def validate_topic_filter(topic_filter: str) -> str:
    """Return ``topic_filter``; raise ValueError saying why unless it is a valid filter."""
    problem = topic_filter_problem(topic_filter)
    if problem is not None:
        raise ValueError(problem)
    return topic_filter


def is_shared_subscription(topic_filter: str) -> bool:
    return topic_filter.startswith(SHARE_PREFIX)


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether a message published to ``topic`` matches ``topic_filter``.

    Both are expected valid; for a shared subscription, what follows ``$share/<group>/``
    is matched.
    """
    if topic_filter.startswith(SHARE_PREFIX):
        parts = topic_filter.split("/", 2)
        if len(parts) < 3:
            return False
        topic_filter = parts[2]
    if topic_filter == topic:
        return True  # what the level by level comparison below would find, at a fraction
    if topic[:1] == "$" and topic_filter[:1] in ("+", "#"):
        return False
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    topic_depth = len(topic_levels)
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True  # also matches the parent level: "a/#" matches "a"
        if index >= topic_depth:
            return False
        if level != "+" and level != topic_levels[index]:
            return False
    return len(filter_levels) == topic_depth
