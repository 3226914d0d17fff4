"""Short soaks (a minute or two each): a pair serving a line of whole thermostats (every
point changed remotely and at the panel) under load and random faults, in three shapes.
Marked "soak": left out of the default run, run by .ci/run as a step of its own (about six
minutes for these three on two cores). A long one is
`python tests/soak/run.py --seconds 1800 --seed 1 --units 32 --ttl-ms 1000`.

AGENT_SOAK_SECONDS scales every run (its value is the first run's length); AGENT_SOAK_SEED
sets the seed.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.soak.run import run

pytestmark = pytest.mark.soak

SCALE = float(os.environ.get("AGENT_SOAK_SECONDS", "90")) / 90
SEED = int(os.environ.get("AGENT_SOAK_SEED", "1"))


def held(result: dict[str, Any], *, faults: int) -> None:
    assert sum(result["faults"].values()) >= faults * SCALE, result
    assert result["load"].get("remote", 0) >= 0.5 * result["units"] * result["seconds"], result
    # Whole thermostats: every point the agents write was changed both ways, and checked.
    assert len(result["points"]) == 6, result
    for point in result["points"]:
        made = result["load_by_point"].get(point, {})
        assert made.get("remote", 0) > 0 and made.get("panel", 0) > 0, (point, result)
        assert result["checked"].get(f"changes of {point}", 0) > 0, (point, result)
    assert result["checked"].get("transactions on the wire", 0) > 0, result
    assert result["checked"]["liveness samples"] > 20 * result["seconds"], result
    assert result["violations"] == 0, result["details"]
    assert result["lost"] == 0, result["details"]


@pytest.mark.timeout(400)
def test_a_line_of_8_at_ttl_3s_under_load_and_faults_of_the_pair_and_its_units() -> None:
    result = run(90 * SCALE, SEED, 8, 3000, faults="pair,unit")
    held(result, faults=6)


@pytest.mark.timeout(300)
def test_a_point_to_point_controller_at_ttl_1s_with_lost_late_and_garbled_replies() -> None:
    result = run(
        60 * SCALE,
        SEED,
        ttl_ms=1000,
        shape="p2p",
        faults="unit,kill,pause,cut,blackhole,broker_restart",
    )
    held(result, faults=10)
    assert result["checked"].get("replies after the sender's timeout", 0) > 0 or (
        "unit_late" not in result["faults"]
    ), result


@pytest.mark.timeout(400)
def test_a_line_of_32_at_ttl_1s_under_load_and_combined_faults() -> None:
    result = run(90 * SCALE, SEED, 32, 1000, faults="combined,pair")
    held(result, faults=15)
    assert any(kind in result["faults"] for kind in ("double_restart", "delay_kill_holder")), result
