"""How many examples a property test tries.

The default suite tries enough to find what each property is for on most runs, and fast;
the thorough count runs with the slow suite (`AGENT_TESTS_THOROUGH=1 pytest -m "slow or
thorough"`, as `.ci/run` does), for the properties marked `thorough`.
"""

from __future__ import annotations

import os

THOROUGH = os.environ.get("AGENT_TESTS_THOROUGH") == "1"


def examples(thorough: int, default: int) -> int:
    """`thorough` in the thorough run, else `default`."""
    return thorough if THOROUGH else default
