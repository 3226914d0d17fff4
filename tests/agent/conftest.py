from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.rig import Rig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    setup = Rig(tmp_path)
    try:
        yield setup
    finally:
        setup.close()
