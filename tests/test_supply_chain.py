"""Supply chain: requirements.lock pins the run-time dependencies with hashes, agrees with
pyproject.toml, is what deploy/build-venv.sh installs from, and is audited for known
vulnerabilities (skipped, saying why, when the advisory service cannot be asked)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.audit import Verdict, audit, judge
from tests.support.processes import AgentProcess

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
# The extras the deployed environment carries besides the dependencies (the Modbus driver).
DEPLOYED_EXTRAS = ("modbus",)


def locked() -> dict[str, tuple[Version, list[str]]]:
    """name -> (version, hashes), from requirements.lock."""
    entries: dict[str, tuple[Version, list[str]]] = {}
    text = re.sub(r"\\\n\s*", " ", LOCK.read_text())  # join continuation lines
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        name, separator, version = requirement.partition("==")
        assert separator, f"not pinned with ==: {line}"
        hashes = [o.removeprefix("--hash=") for o in options if o.startswith("--hash=")]
        entries[canonicalize_name(name)] = (Version(version), hashes)
    return entries


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in DEPLOYED_EXTRAS:
        specs += project["optional-dependencies"][extra]
    return [Requirement(spec) for spec in specs]


def test_every_runtime_dependency_is_pinned_in_the_lock() -> None:
    pins = locked()
    for requirement in runtime_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in requirements.lock (run pip-compile)"
        version, _ = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements.lock pins {name}=={version}, outside {requirement} of pyproject.toml"
        )


def test_every_locked_release_has_hashes() -> None:
    pins = locked()
    assert len(pins) >= len(runtime_requirements())
    for name, (_, hashes) in pins.items():
        assert hashes, f"{name} has no hash"
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), name


def test_the_lock_says_how_it_was_made() -> None:
    header = LOCK.read_text().split("\n\n", 1)[0]
    assert "pip-compile" in header and "--generate-hashes" in header
    assert "/work" not in LOCK.read_text() and "file://" not in LOCK.read_text()


def test_build_venv_installs_from_the_lock() -> None:
    script = (ROOT / "deploy" / "build-venv.sh").read_text()
    assert "requirements.lock" in script
    assert re.search(r"--require-hashes --no-deps -r \"\$lock\"", script)
    assert re.search(r"--no-deps \"\$\{packages\[@\]\}\"", script)


# --- The audit -------------------------------------------------------------------------------


def report(*dependencies: dict[str, object]) -> str:
    return json.dumps({"dependencies": list(dependencies), "fixes": []})


def test_a_known_vulnerability_fails_the_audit() -> None:
    vulnerable = {
        "name": "urllib3",
        "version": "1.26.4",
        "vulns": [{"id": "PYSEC-2021-108", "fix_versions": ["1.26.5"], "aliases": []}],
    }
    verdict = judge(1, report(vulnerable, {"name": "gmqtt", "version": "0.8.0", "vulns": []}), "")
    assert verdict.kind == "vulnerable"
    assert verdict.detail == "urllib3 1.26.4: PYSEC-2021-108 (fixed in 1.26.5)"


def test_an_unreachable_service_is_no_verdict() -> None:
    refused = "requests.exceptions.ConnectionError: HTTPSConnectionPool: Max retries exceeded"
    assert judge(1, "", refused).kind == "unreachable"
    not_found = "Dependency not found on PyPI and could not be audited: gmqtt (0.8.0)"
    nothing_known = report(
        {"name": "gmqtt", "skip_reason": not_found}, {"name": "pyserial", "skip_reason": "x"}
    )
    assert judge(0, nothing_known, "").kind == "unreachable"


def test_a_release_the_service_does_not_know_fails_the_audit() -> None:
    partly = report(
        {"name": "gmqtt", "version": "0.8.0", "vulns": []},
        {"name": "private-lib", "skip_reason": "Dependency not found on PyPI: private-lib (1.0)"},
    )
    verdict = judge(0, partly, "")
    assert verdict.kind == "failed" and "private-lib" in verdict.detail
    assert judge(2, "not json", "pip-audit: error: bad arguments").kind == "failed"


def test_a_clean_report_passes() -> None:
    clean = report({"name": "gmqtt", "version": "0.8.0", "vulns": []})
    assert judge(0, clean, "") == Verdict("clean", "1 locked releases, no known vulnerability")


def test_audit_of_the_lock() -> None:
    verdict = audit(LOCK)
    if verdict.kind == "unreachable":
        pytest.skip(
            f"dependency audit not possible, the advisory service is unreachable: {verdict.detail}"
        )
    assert verdict.kind == "clean", f"dependency audit of requirements.lock: {verdict.detail}"


def test_the_agent_drives_a_modbus_line_without_pymodbus(tmp_path: Path) -> None:
    """The deployed environment has no pymodbus (the driver's codec is our own): an agent
    whose every import of it fails still serves a Modbus line, and no message blames a
    missing module on the serial settings."""
    blocker = tmp_path / "pymodbus"
    blocker.mkdir()
    (blocker / "__init__.py").write_text('raise ImportError("no pymodbus in this environment")\n')
    process = AgentProcess(
        ["--simulate"],
        {"AGENT_SERIAL__DRIVER": "modbus", "PYTHONPATH": str(tmp_path)},
        merge_stderr=True,
    )
    try:
        process.wait_for(re.compile(r"published set point \d"), timeout=30)
    finally:
        assert process.stop() == 0, process.tail()
    assert not any("AGENT_SERIAL" in line for line in process.lines), process.tail()
