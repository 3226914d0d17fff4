"""Exponential backoff with full jitter: the one retry schedule of the agent.

Attempt ``n`` (0-based) waits a delay drawn uniformly from ``[0, min(maximum, minimum * 2**n)]``:
the ceiling doubles from ``minimum`` up to ``maximum``. Spreading each wait over the whole
interval, rather than adding a little jitter to a fixed delay, is what keeps a fleet that lost
its broker (or a line that lost its port) at the same instant from coming back in lock-step.

::

    backoff = Backoff(0.5, 30.0)
    while True:
        try:
            await connect()
            break
        except OSError:
            await backoff.sleep()
    backoff.reset()  # start from the bottom again after a success that lasted

``Backoff`` is also an endless iterator of delays (``next(backoff)``), and takes a seeded
``random.Random`` so that tests can replay or bound the draws.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Final

# 2**64 times any sensible minimum is past any maximum; larger exponents would only overflow.
_MAX_DOUBLINGS: Final = 64


def backoff_ceiling(attempt: int, minimum: float, maximum: float) -> float:
    """The largest delay attempt ``attempt`` (0-based) may wait: ``min(maximum, minimum*2**n)``."""
    if attempt < 0:
        raise ValueError("attempt must be >= 0")
    return min(maximum, minimum * 2.0 ** min(attempt, _MAX_DOUBLINGS))


def backoff_delay(
    attempt: int,
    minimum: float,
    maximum: float,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """The delay before attempt ``attempt`` (0-based): ``uniform(0, backoff_ceiling(...))``."""
    return uniform(0.0, backoff_ceiling(attempt, minimum, maximum))


class Backoff:
    """The delays of one retry loop: exponential, full jitter, between ``minimum`` and
    ``maximum`` seconds of ceiling. ``reset()`` starts over from ``minimum``."""

    def __init__(self, minimum: float, maximum: float, *, rng: random.Random | None = None) -> None:
        if not minimum > 0:
            raise ValueError("the minimum backoff must be positive")
        if maximum < minimum:
            raise ValueError(f"the maximum backoff ({maximum}) is below the minimum ({minimum})")
        self.minimum = minimum
        self.maximum = maximum
        self._random = rng or random.Random()
        self._attempts = 0

    @property
    def attempts(self) -> int:
        """Delays handed out since the start or the last ``reset()``."""
        return self._attempts

    def next_delay(self, *, ceiling: float | None = None) -> float:
        """The delay before the next attempt, counted as handed out.

        ``ceiling`` caps this one delay (and its schedule) below the usual ``maximum``: for a
        caller that must be back within a deadline of its own, such as a lease holder.
        """
        maximum = self.maximum if ceiling is None else min(self.maximum, ceiling)
        delay = backoff_delay(
            self._attempts, min(self.minimum, maximum), maximum, self._random.uniform
        )
        self._attempts += 1
        return delay

    def reset(self) -> None:
        self._attempts = 0

    async def sleep(self, *, ceiling: float | None = None) -> float:
        """Sleep for the next delay; return it."""
        delay = self.next_delay(ceiling=ceiling)
        await asyncio.sleep(delay)
        return delay

    def __iter__(self) -> Backoff:
        return self

    def __next__(self) -> float:
        return self.next_delay()
