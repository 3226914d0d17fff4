from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ops.support import Topics
from tests.support.rig import LineRig, line_rig

UNITS = 4


@pytest.fixture
def line(tmp_path: Path) -> Iterator[LineRig]:
    with line_rig(tmp_path, UNITS) as rig:
        yield rig


@pytest.fixture
def topics(line: LineRig) -> Iterator[Topics]:
    """What the agents publish about themselves and their devices."""
    watched = Topics(line.port, "agents/#", "devices/+/status", "devices/+/availability")
    try:
        yield watched
    finally:
        watched.close()
