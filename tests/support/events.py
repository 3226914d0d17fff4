"""Waiting for the first item of a growing list (filled by another thread) that a test needs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def first_to_come(
    changed: threading.Condition,
    items: list[T],
    predicate: Callable[[T], bool],
    timeout: float,
    nothing: Callable[[], Exception],
) -> T:
    """The first of `items` (there already, or appended later under `changed`, which is
    notified then) that `predicate` likes; `nothing()` is raised after `timeout`."""
    deadline = time.monotonic() + timeout
    seen = 0
    with changed:
        while True:
            for item in items[seen:]:
                if predicate(item):
                    return item
            seen = len(items)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise nothing()
            changed.wait(remaining)
