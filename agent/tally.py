"""Counts and durations kept where things happen (the bus, the store client, the pair) and
read when asked (the metrics endpoint): a dict increment per event, nothing else.

A key is a tuple of label values (a unit's name, a function, a result), never a value read
or written: the set of keys stays bounded by the configuration. Durations go to fixed
buckets (upper bounds in seconds), kept cumulative only when read."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

Key = tuple[str, ...]


@dataclass(slots=True)
class Durations:
    """One histogram: a count per bucket (the last one above every bound), their sum."""

    counts: list[int]
    total_s: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[int]:
        running, out = 0, []
        for n in self.counts:
            running += n
            out.append(running)
        return out


@dataclass(slots=True)
class Tally:
    """Events by key; durations by key (a histogram counts its own events)."""

    bounds_s: Sequence[float] = ()
    counts: dict[Key, int] = field(default_factory=dict)
    durations: dict[Key, Durations] = field(default_factory=dict)

    def count(self, key: Key, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def observe(self, key: Key, took_s: float) -> None:
        """One event of `key` that took `took_s`, in its histogram."""
        durations = self.durations.get(key)
        if durations is None:
            durations = self.durations[key] = Durations([0] * (len(self.bounds_s) + 1))
        durations.counts[bisect.bisect_left(self.bounds_s, took_s)] += 1
        durations.total_s += took_s

    def items(self) -> Iterator[tuple[Key, int]]:
        """A copy's items: safe while another thread counts."""
        return iter(list(self.counts.items()))

    def histograms(self) -> Iterator[tuple[Key, Durations]]:
        return iter(list(self.durations.items()))
