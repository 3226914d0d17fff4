"""A short soak (about a minute): a pair serving a line under random faults. Marked "soak":
left out of the default run, run by .ci/run as a step of its own. A long one is
`python tests/soak/run.py --seconds 1800 --seed 1`."""

from __future__ import annotations

import os

import pytest

from tests.soak.run import run

pytestmark = pytest.mark.soak


@pytest.mark.timeout(600)
def test_a_short_soak_breaks_no_invariant() -> None:
    seconds = float(os.environ.get("AGENT_SOAK_SECONDS", "60"))
    result = run(seconds, seed=int(os.environ.get("AGENT_SOAK_SEED", "1")), units=4, ttl_ms=3000)
    assert sum(result["faults"].values()) >= 5, result
    assert result["violations"] == 0, result["details"]
    assert result["lost"] == 0, result["details"]
