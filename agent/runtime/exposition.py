"""Prometheus's text format (version 0.0.4): metric families, built when scraped, and the
text they are exposed as. Plain code, no I/O.

The agent writes the format itself instead of importing a client library for it: the
library's package pulls in an HTTP server, a WSGI server and urllib when imported (2.6 MB
of the running agent's resident memory, measured), for a job of a few dozen lines that
needs none of them. What is written here is checked against that library's parser and
against Prometheus's own promtool and server in the tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["gauge", "counter", "histogram"]

Sample = tuple[str, tuple[tuple[str, str], ...], float]
"""A sample's name (the family's and its suffix), its labels, its value."""


@dataclass(slots=True)
class Family:
    """One metric's samples. A counter's name is given without `_total`: its samples and
    its HELP and TYPE lines carry it, as the format's clients write them."""

    name: str
    doc: str
    kind: Kind
    labels: tuple[str, ...] = ()
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind == "counter" and self.name.endswith("_total"):
            self.name = self.name[: -len("_total")]

    def add(self, values: Sequence[str], value: float) -> None:
        """A gauge's or a counter's sample, its label values in the family's order."""
        suffix = "_total" if self.kind == "counter" else ""
        self.samples.append((self.name + suffix, self._labelled(values), float(value)))

    def add_histogram(
        self, values: Sequence[str], buckets: Sequence[tuple[str, float]], sum_value: float
    ) -> None:
        """A histogram's samples: its cumulative buckets (upper bound as written, `+Inf`
        last), its count (the last bucket's), its sum."""
        labels = self._labelled(values)
        for bound, count in buckets:
            self.samples.append((self.name + "_bucket", (*labels, ("le", bound)), float(count)))
        self.samples.append((self.name + "_count", labels, float(buckets[-1][1])))
        self.samples.append((self.name + "_sum", labels, float(sum_value)))

    def _labelled(self, values: Sequence[str]) -> tuple[tuple[str, str], ...]:
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name}: {len(values)} label value(s) for {self.labels}")
        return tuple(zip(self.labels, values, strict=True))

    @property
    def exposed_name(self) -> str:
        return self.name + "_total" if self.kind == "counter" else self.name


def text(families: Iterable[Family]) -> bytes:
    """The exposition of `families`, in their order; a family without samples still has
    its HELP and TYPE lines."""
    lines: list[str] = []
    for family in families:
        name = family.exposed_name
        lines.append(f"# HELP {name} {_escape_doc(family.doc)}")
        lines.append(f"# TYPE {name} {family.kind}")
        for sample, labels, value in family.samples:
            if labels:
                shown = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
                lines.append(f"{sample}{{{shown}}} {number(value)}")
            else:
                lines.append(f"{sample} {number(value)}")
    lines.append("")
    return "\n".join(lines).encode()


def number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_doc(doc: str) -> str:
    return doc.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
