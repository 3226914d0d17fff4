"""The pair's lock protocol, checked by the model checker spin (pair.pml, README.md here).

The default run checks that the model's constants are the code's and that each deliberately
broken protocol gives a counterexample (seconds each). The searches that show the protocol
holds are complete searches, half a minute of both cores at the coarse scale (SCALE=3) and
minutes and gigabytes at the full one: marker "model", run with -m model.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.client.lock import RENEWALS_PER_TTL, default_safety_margin_s
from agent.config import LockSettings
from agent.pair.lock_delay import LockDelay

MODEL = Path(__file__).with_name("pair.pml")
MAX_DEPTH = 3_000_000  # -m: the searches here reach about 500 000
MEMORY_MB = 3_000

needs_spin = pytest.mark.skipif(
    shutil.which("spin") is None or shutil.which("gcc") is None,
    reason="the model checker needs spin and gcc (Debian packages spin, gcc)",
)


@dataclass
class Search:
    errors: int
    depth: int
    states: int
    seconds: float
    output: str

    @property
    def complete(self) -> bool:
        return self.depth < MAX_DEPTH - 1 and "max search depth too small" not in self.output

    @property
    def violated(self) -> bool:
        return self.errors > 0 and "assertion violated" in self.output


def check(tmp_path: Path, *defines: str, timeout: float = 600, quick: bool = False) -> Search:
    """spin -a, gcc, pan: one exhaustive search of the model with these -D options.

    quick: compile without optimisation, for searches that end within a second (a
    counterexample found at once), where compiling takes longer than searching."""
    work = tmp_path / "spin"
    work.mkdir()
    shutil.copy(MODEL, work / MODEL.name)
    flags = [f"-D{d}" for d in defines]
    subprocess.run(["spin", "-a", *flags, MODEL.name], cwd=work, check=True, capture_output=True)
    subprocess.run(
        [
            "gcc",
            "-O0" if quick else "-O2",
            "-DSAFETY",
            f"-DMEMLIM={MEMORY_MB}",
            "-o",
            "pan",
            "pan.c",
        ],
        cwd=work,
        check=True,
        capture_output=True,
    )
    started = time.monotonic()
    done = subprocess.run(
        ["./pan", f"-m{MAX_DEPTH}"], cwd=work, capture_output=True, text=True, timeout=timeout
    )
    seconds = time.monotonic() - started
    out = done.stdout + done.stderr
    summary = re.search(r"depth reached (\d+), errors: (\d+)", out)
    states = re.search(r"(\d+) states, stored", out)
    assert summary and states, out
    return Search(int(summary[2]), int(summary[1]), int(states[1]), seconds, out)


# ------------------------------------------------------------------ the model is the code's


def model_constants(scale: int) -> dict[str, int]:
    """The #defines of one SCALE block of pair.pml."""
    text = MODEL.read_text()
    blocks = re.split(r"^#(?:if|elif) SCALE == (\d+)|^#else$|^#endif$", text, flags=re.M)
    for number, body in zip(blocks[1::2], blocks[2::2], strict=False):
        if number == str(scale):
            return {
                name: int(value)
                for name, value in re.findall(r"^#define\s+(\w+)\s+(\d+)", body or "", re.M)
            }
    raise AssertionError(f"no SCALE == {scale} block in {MODEL.name}")


def test_the_models_constants_are_the_codes_defaults() -> None:
    c = model_constants(1)
    ttl_ms = LockSettings().ttl_ms
    ttl_s = ttl_ms / 1000
    assert ttl_ms / c["TICK_MS"] == c["TTL"]
    assert c["TTL"] / RENEWALS_PER_TTL == pytest.approx(c["RENEW"], abs=0.5)
    assert default_safety_margin_s(ttl_s) * 1000 / c["TICK_MS"] == pytest.approx(c["MARGIN_"])
    # The lock delay is a full TTL: seen held at 0, over at ttl_s.
    delay = LockDelay.starting(ttl_s, now=0.0)
    assert delay.wait_s(0.0) * 1000 / c["TICK_MS"] == pytest.approx(c["LOCKDELAY"])
    assert c["LOCKDELAY"] == c["TTL"]
    # The margin must cover a write on the line and the clock-rate error both ways.
    assert c["MARGIN_"] >= c["WDUR"] + 2 * c["DRIFT"]


def test_every_scale_keeps_the_margin_and_the_renewals() -> None:
    for scale in (1, 2, 3):
        c = model_constants(scale)
        assert c["MARGIN_"] >= c["WDUR"] + 2 * c["DRIFT"], scale
        assert c["LOCKDELAY"] == c["TTL"], scale
        assert c["RENEW"] == round(c["TTL"] / RENEWALS_PER_TTL), scale


# ------------------------------------------------------------------ the checks


def holds(tmp_path: Path, *defines: str) -> None:
    """The property checked with `defines` holds: no error, and the search was complete."""
    search = check(tmp_path, *defines)
    assert search.complete, search.output
    assert search.errors == 0, search.output


QUICK = ("SCALE=3", "NO_EXITS")  # the coarse clock, no process stops or crashes


@needs_spin
@pytest.mark.model
@pytest.mark.timeout(900)
def test_one_master_on_the_line_while_the_store_keeps_its_contents(tmp_path: Path) -> None:
    """Implied by the check across store restarts (a restart is one more choice)."""
    holds(tmp_path, *QUICK, "STORE_KEEPS")


@needs_spin
@pytest.mark.model
@pytest.mark.timeout(900)
def test_one_master_on_the_line_with_exits_and_crashes(tmp_path: Path) -> None:
    holds(tmp_path, "SCALE=3")


@needs_spin
@pytest.mark.model
@pytest.mark.timeout(300)
def test_one_master_on_the_line_across_store_restarts(tmp_path: Path) -> None:
    """Store restarts without contents: a renewal after a reconnect reads the lock first
    (LeasedLock.renew in doubt), so a lock the store forgot is a lost lease (README.md)."""
    holds(tmp_path, *QUICK)


@needs_spin
@pytest.mark.model
@pytest.mark.timeout(900)
def test_store_writes_carry_the_newest_token_across_store_restarts(tmp_path: Path) -> None:
    holds(tmp_path, *QUICK, "STORE")


@needs_spin
@pytest.mark.model
@pytest.mark.timeout(900)
def test_a_late_store_write_is_refused_once_another_holder_wrote(tmp_path: Path) -> None:
    """(2'): with writes slower than the margin, each key's fencing keeps the order once
    the new holder wrote every key (the takeover fence, per point)."""
    holds(tmp_path, *QUICK, "STORE", "STORE_KEEPS", "LONG_DELAY")


# Deliberately broken protocols: each must give a counterexample where the protocol itself
# has none, or the model (or the property) is too weak to see what it claims to check.
QUICK_VARIANTS = [
    ("NO_DEADLINE", "STORE_KEEPS"),  # writes ignore the local deadline
    ("WITNESS",),  # a lease taken after a store restart drives: the model is not stuck
    ("NO_GET",),  # the renewal before the fix: SET NEX re-creates a forgotten lock
    ("NO_LOCK_DELAY",),  # a new lease drives at once
    ("NO_CONFIRM",),  # writes with the token from before a reconnect
    ("DROP_RULE",),  # the lock delay only after a drop while L was seen held
    ("TRUST_ABSENCE",),  # an absent lock ends the lock delay, sync record or not
    ("CHECK_THEN_WAIT", "STORE_KEEPS"),  # the driver waits between the gate and the bytes
    # the takeover fences the first point's key only: a late write lands on the second
    ("STORE", "STORE_KEEPS", "LONG_DELAY", "FENCE_FIRST_KEY"),
]
SLOW_VARIANTS = [
    ("STORE", "STORE_KEEPS", "LONG_DELAY", "NO_FENCING"),  # (2') needs fencing
]


@needs_spin
@pytest.mark.parametrize("variant", QUICK_VARIANTS, ids=lambda v: "-".join(v))
def test_a_broken_protocol_gives_a_counterexample(tmp_path: Path, variant: tuple[str, ...]) -> None:
    search = check(tmp_path, *QUICK, *variant, quick=True)
    assert search.violated, search.output


@needs_spin
@pytest.mark.model
@pytest.mark.timeout(900)
@pytest.mark.parametrize("variant", SLOW_VARIANTS, ids=lambda v: "-".join(v))
def test_a_broken_protocol_gives_a_counterexample_slow(
    tmp_path: Path, variant: tuple[str, ...]
) -> None:
    search = check(tmp_path, *QUICK, *variant)
    assert search.violated, search.output
