"""A short run of the parser fuzzers (tests/bench/fuzz_parsers.py runs 10^5 inputs each)."""

from __future__ import annotations

import pytest

from tests.bench import fuzz_parsers

INPUTS = 600


@pytest.mark.parametrize("target", fuzz_parsers.targets(), ids=lambda t: t.name)
def test_only_the_parsers_own_errors_come_out(target: fuzz_parsers.Target) -> None:
    fuzz_parsers.fuzz(target, INPUTS, fuzz_parsers.DEFAULT_SEED + 1)
    assert target.tried >= INPUTS
    assert target.failures == {}


def test_a_failure_is_reported_with_where_it_was_raised() -> None:
    def parser(data: bytes) -> None:
        if len(data) > 3:
            raise KeyError("not a documented error")

    target = fuzz_parsers.Target("broken", parser, lambda: [b"abcd"])
    fuzz_parsers.fuzz(target, 100, 1)
    assert target.tried >= 100
    (where,) = target.failures
    assert where.startswith("KeyError at test_fuzz_parsers.py:")
