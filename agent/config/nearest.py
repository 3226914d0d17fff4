"""The known names closest to one given, pure: what a typo most likely meant, for the
"did you mean ...?" of a refused variable, line, device or instance."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

SUGGESTED = 3
CLOSE = 0.6
"""How alike (difflib's ratio) a known name must be to be suggested..."""
AS_CLOSE = 0.1
"""...and how much less alike than the closest one."""


def suggestions(name: str, known: Iterable[str]) -> list[str]:
    """The known names closest to `name`, best first: a case slip, a digit too many. Only
    those about as close as the closest: a typo has one or two likely meanings."""
    by_case = {k.casefold(): k for k in known}
    exact = by_case.get(name.casefold())
    if exact is not None and exact != name:
        return [exact]
    scored = sorted(
        ((difflib.SequenceMatcher(None, name, k).ratio(), k) for k in by_case.values()),
        key=lambda pair: (-pair[0], pair[1]),
    )
    if not scored or scored[0][0] < CLOSE:
        return []
    best = scored[0][0]
    return [k for score, k in scored[:SUGGESTED] if score >= best - AS_CLOSE]
