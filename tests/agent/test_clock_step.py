"""A wall-clock step (NTP) must neither stall lease renewals nor break safety.

Nothing the agent times keeps to the wall clock (the lease, its renewals and the periodic
jobs run on the monotonic one); its clock guard says a step. These tests step the active's
wall clock and watch its renewals in the store.

The active agent runs under libfaketime (Debian package `faketime`, which brings
`libfaketime`) with only its wall clock faked: FAKETIME_TIMESTAMP_FILE holds a relative
offset in seconds ("+0", then "-30" or "-3600"), re-read on every call
(FAKETIME_NO_CACHE=1), and FAKETIME_DONT_FAKE_MONOTONIC=1 leaves the monotonic clock,
on which the lease deadline and asyncio's timers run, alone. The standby runs unfaked.

libfaketime 0.9.10 turns the absolute CLOCK_MONOTONIC deadline of Python's time.sleep()
into an invalid one when the monotonic clock is not faked (EINVAL); the only sleeper in
the agent is pyserial's close() of a socket:// port, which the driver treats as best
effort, so it costs nothing here.

A step back of an hour leaves the client's hybrid logical clock an hour ahead of its wall
clock. That is no reason to stop: the clock keeps counting from where it was, the service
has seen those timestamps already, and it is the service that judges skew (protocol.md §4).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.runtime.clock_guard import ClockStepDetector, StallDetector, stalled
from tests.support.processes import AgentProcess
from tests.support.rig import ACTIVE, APPLIED, STANDBY, Rig

CLOCK_STEPPED = re.compile(r"wall clock stepped by ([-+][0-9.]+) s")
STEPPED_DOWN = re.compile(r"stepped down to standby")
BECAME_ACTIVE = re.compile(r"became active")
# The lease is renewed every third of the TTL; this many renewals span three TTLs.
RENEWALS_TO_WATCH = 9


def find_libfaketime() -> str | None:
    """libfaketime.so.1 as Debian installs it (multiarch directory), or None."""
    listed = ""
    with contextlib.suppress(FileNotFoundError):
        listed = subprocess.run(
            ["dpkg-query", "-L", "libfaketime"], capture_output=True, text=True, check=False
        ).stdout
    candidates = [line for line in listed.splitlines() if line.endswith("/libfaketime.so.1")]
    for pattern in ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib*/faketime/libfaketime.so.1"):
        candidates += sorted(glob.glob(pattern))
    return next((path for path in candidates if os.path.isfile(path)), None)


def faked_env(library: str, offset_file: Path) -> dict[str, str]:
    return {
        "LD_PRELOAD": library,
        "FAKETIME_TIMESTAMP_FILE": str(offset_file),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        # Left to itself, libfaketime 0.9.10 turns on this "fix" with glibc >= 2.34, and
        # it breaks timed waits on monotonic condition variables: Python's GIL hand-over
        # then stalls for 100 ms and more, and the driver's worker thread misses replies.
        "FAKETIME_FORCE_MONOTONIC_FIX": "0",
    }


@pytest.fixture(scope="module")
def libfaketime(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The library, once checked to fake the wall clock and leave the monotonic one."""
    library = find_libfaketime()
    if library is None:
        if os.environ.get("CI"):
            pytest.fail("libfaketime is required in CI (Debian package: faketime)")
        pytest.skip("libfaketime is not installed (Debian package: faketime)")
    offset_file = tmp_path_factory.mktemp("faketime") / "offset"
    offset_file.write_text("-3600\n")
    faked = subprocess.run(
        [sys.executable, "-S", "-c", "import time; print(time.time(), time.monotonic())"],
        env={**os.environ, **faked_env(library, offset_file)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    real_wall, real_monotonic = time.time(), time.monotonic()
    wall, monotonic = (float(word) for word in faked.stdout.split())
    assert -3700 < wall - real_wall < -3500, "libfaketime does not fake the wall clock"
    assert abs(monotonic - real_monotonic) < 60, "libfaketime fakes the monotonic clock too"
    return library


def expect_renewal(rig: Rig, agent: AgentProcess, timeout: float) -> None:
    """The next change of the lock key is a renewal by "a", within `timeout`."""
    try:
        rig.expect_renewal("a", timeout)
    except AssertionError as exc:
        agent.drain()
        raise AssertionError(f"{exc}: {agent.lines}") from None


def start_faked_active(rig: Rig, library: str, offset_file: Path) -> AgentProcess:
    """Agent "a", active under libfaketime, once its jobs and its clock guard run."""
    offset_file.write_text("+0\n")
    agent = rig.start_agent("a", **faked_env(library, offset_file))
    agent.wait_for_new(ACTIVE)
    agent.wait_for_new(re.compile("started as active"))
    # The periodic jobs and the clock guard start just after that line. A renewal seen after
    # it proves they run, so that a step from here on happens under them, not before.
    rig.watch_lock()
    expect_renewal(rig, agent, rig.ttl_ms / 1000)
    return agent


@pytest.mark.parametrize(
    "step_s",
    [
        pytest.param(-30, id="30s-back", marks=pytest.mark.slow),
        pytest.param(-3600, id="an-hour-back"),
    ],
)
def test_wall_clock_step_back_keeps_the_active_renewing(
    rig: Rig, libfaketime: str, tmp_path: Path, step_s: int
) -> None:
    offset_file = tmp_path / "faketime-offset"
    active = start_faked_active(rig, libfaketime, offset_file)
    standby = rig.start_agent("b")
    standby.wait_for_new(STANDBY)

    offset_file.write_text(f"{step_s:+d}\n")
    stepped = float(active.wait_for_new(CLOCK_STEPPED).group(1))
    assert stepped == pytest.approx(step_s, abs=1.0)
    # Discard renewals from before the step was noticed.
    while not rig.client.notifications.empty():
        rig.client.notifications.get_nowait()

    ttl_s = rig.ttl_ms / 1000
    # Renewals keep coming, each within a TTL of the last (a stall would cost the lease).
    for _ in range(RENEWALS_TO_WATCH // 2):
        expect_renewal(rig, active, ttl_s)
    # A remote change made after the step is still applied, by the active.
    assert rig.remote_set(b"23.5") == b"+OK\r\n"
    rig.wait_device(lambda d: d.setpoint == 23.5)
    active.wait_for_new(APPLIED)
    for _ in range(RENEWALS_TO_WATCH - RENEWALS_TO_WATCH // 2):
        expect_renewal(rig, active, ttl_s)

    assert rig.lock_holder() == b"a"
    active.drain()
    standby.drain()
    assert not any(STEPPED_DOWN.search(line) for line in active.lines), "".join(active.lines)
    assert not any(BECAME_ACTIVE.search(line) for line in standby.lines), "".join(standby.lines)
    assert rig.device_writes() == [23.5]


# --------------------------------------------------------------------------- the detector


class Clocks:
    def __init__(self) -> None:
        self.wall = 1_700_000_000.0
        self.monotonic = 5_000.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.monotonic += seconds


def detector(clocks: Clocks, threshold_s: float = 1.0) -> ClockStepDetector:
    return ClockStepDetector(threshold_s, lambda: clocks.wall, lambda: clocks.monotonic)


def test_detector_is_quiet_while_both_clocks_run_together() -> None:
    clocks = Clocks()
    guard = detector(clocks)
    for _ in range(10):
        clocks.advance(0.5)
        assert guard.check() is None


def test_detector_reports_a_step_back_and_forward_once() -> None:
    clocks = Clocks()
    guard = detector(clocks)
    clocks.advance(0.5)
    clocks.wall -= 3600
    assert guard.check() == pytest.approx(-3600)
    clocks.advance(0.5)
    assert guard.check() is None  # the new offset is the reference from now on
    clocks.wall += 90
    assert guard.check() == pytest.approx(90)
    assert guard.check() is None


def test_detector_ignores_slewing_below_the_threshold() -> None:
    clocks = Clocks()
    guard = detector(clocks, threshold_s=1.0)
    for _ in range(5):
        clocks.advance(0.5)
        clocks.wall += 0.75  # each below the threshold, together well above it
        assert guard.check() is None
    clocks.wall -= 1.0
    assert guard.check() == pytest.approx(-1.0)  # the threshold itself counts


def test_detector_notices_a_step_while_the_loop_was_stalled() -> None:
    clocks = Clocks()
    guard = detector(clocks)
    clocks.monotonic += 30  # a long stall: both clocks ran 30 s, no step
    clocks.wall += 30
    assert guard.check() is None
    clocks.monotonic += 30  # a 30 s stall during which the wall clock went back 10 s
    clocks.wall += 20
    assert guard.check() == pytest.approx(-10)


@given(st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=1, max_size=30))
def test_a_stall_is_reported_once_by_how_late_the_wake_up_came(lates: list[float]) -> None:
    clocks = Clocks()
    stalls = StallDetector(0.5, 0.25, lambda: clocks.monotonic)
    for late in lates:
        clocks.advance(0.5 + late)
        reported = stalls.check()
        if late > 0.25 + 1e-9:
            assert reported == pytest.approx(late)
        elif late < 0.25 - 1e-9:
            assert reported is None
    clocks.advance(0.5)
    assert stalls.check() is None  # each stall once: the next wake-up on time is quiet


def test_the_stall_line_names_the_lease_and_whether_it_drove_the_line() -> None:
    line = stalled(0.84, True, 1000)
    assert "did not run for 0.84 s while it drove the line" in line
    assert "1000 ms (AGENT_LOCK__TTL_MS)" in line
    assert "drove" not in stalled(0.3, False, 3000)
