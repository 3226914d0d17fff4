"""A test's timeout fails it, whatever catches the timeout's exception on the way."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SWALLOWED = """
import time

import pytest
from hypothesis import given, settings, strategies as st


@pytest.mark.timeout(0.5)
def test_code_that_swallows_every_exception():
    try:
        time.sleep(1.0)
    except BaseException:
        pass


@pytest.mark.timeout(0.5)
@settings(deadline=None, max_examples=3, database=None)
@given(st.integers())
def test_a_property_that_replays_into_a_pass(x):
    try:
        time.sleep(0.3)
    except BaseException:
        pass
"""


def test_a_test_past_its_timeout_fails(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text(textwrap.dedent(SWALLOWED))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    pytest = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    run = subprocess.run(
        [*pytest, "-q", "-n", "0", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1, run.stdout
    assert "2 failed" in run.stdout, run.stdout
    assert "its timeout fired during call" in run.stdout, run.stdout
