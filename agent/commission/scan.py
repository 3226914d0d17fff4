"""A bus scan on a real port: the sweep's probes (agent.commission.sweep) sent and heard
through the drivers' port (agent.controller.port), one transaction at a time, with the
line's silent interval after each. Blocking: a command's own thread, no event loop.

The scan reads what comes back raw, not through a driver's exchange: a driver drops noise
and other addresses' replies by design, where a scan must see them to tell a collision.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from agent.commission.sweep import (
    PATIENT_REPLY_S,
    Probe,
    Protocol,
    Settings,
    Sweep,
    SweepResult,
    longest_reply,
    others_before,
    reply_complete,
)
from agent.controller.driver import LinkLost, LinkStats, is_device_path
from agent.controller.modbus_driver import NETWORK_GAP_S
from agent.controller.port import SerialPort
from agent.controller.profile import Profile
from agent.controller.timing import LineTiming

MAX_HEARD = 512
"""The most bytes one reply window takes in (two replies of the longest line, and noise)."""
STALE_LOOK_S = 0.0002
"""How long the scan looks for bytes already in before a request (a reply come late)."""


class PortBusy(Exception):
    """Another process has the port open or locked."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long the scan waits for a reply after its request, and for the line to fall
    quiet within a reply cut short."""

    timing: LineTiming
    protocol: Protocol
    given_s: float | None = None
    """The reply timeout given (--reply-timeout-ms); None: from the line's timing."""

    @property
    def gap_s(self) -> float:
        return max(self.timing.chars_s(2), NETWORK_GAP_S)

    def reply_s(self, probe: Probe) -> float:
        """Twice a typical turnaround and the longest reply's line time, at least 50 ms
        (the drivers' reply timeout, agent.controller.timing), or the one given; for an
        address whose reply came late, at least PATIENT_REPLY_S."""
        if self.given_s is not None:
            wait_s = self.given_s
        else:
            wait_s = self.timing.reply_timeout_s(longest_reply(self.protocol, probe))
        return max(wait_s, PATIENT_REPLY_S) if probe.patient else wait_s


def holders(path: str) -> list[int]:
    """The other processes that have the device `path` open (from /proc; those this user
    may look at)."""
    real = os.path.realpath(path)
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) == real:
                        found.append(int(entry.name))
                        break
    return found


def check_port_free(url: str) -> None:
    """PortBusy when another process has the local port open or flock()ed (as the agent
    and pyserial's exclusive open do); LinkLost when it cannot be opened. A URL
    (socket://, rfc2217://) has neither."""
    if not is_device_path(url):
        return
    # A pseudo-terminal's far end keeps it open by design: only its lock tells.
    others = [] if os.path.realpath(url).startswith("/dev/pts/") else holders(url)
    if others:
        raise PortBusy(
            f"{url} is open in process {', '.join(map(str, others))}: close it (or stop the "
            "program) first"
        )
    try:
        fd = os.open(url, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise LinkLost(f"cannot open {url}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise PortBusy(f"{url} is locked by another process") from None
    finally:
        os.close(fd)


def sweep_port(
    url: str,
    sweep: Sweep,
    timeouts: Timeouts,
) -> tuple[SweepResult, float]:
    """Runs the sweep on the port at its settings: its result and how long it took."""
    settings = sweep.result.settings
    port = SerialPort(
        url,
        LinkStats(),
        baudrate=settings.baudrate,
        parity=settings.parity,
        bytesize=settings.bytesize,
        stopbits=settings.stopbits,
    )
    timing = sweep.timing
    started = time.monotonic()
    port.open()
    try:
        port.wait_for_quiet(timing.silent_s, 2 * timing.silent_s + timeouts.gap_s)
        while True:
            probe = sweep.next_probe()
            if probe is None:
                # The last addresses' replies may be late too: a last look for them.
                if not sweep.unanswered or not sweep.heard_late(_last_look(port)):
                    break
                continue
            sweep.heard_late(_stale(port))
            raw, took_s, late = _exchange(port, probe, sweep.protocol, timing, timeouts)
            sweep.record(probe, raw, took_s, late)
    finally:
        port.close()
    return sweep.result, time.monotonic() - started


def _stale(port: SerialPort) -> bytes:
    """What came in since the last reply window closed: a reply after its timeout."""
    stale = b""
    while len(stale) < MAX_HEARD:
        more = port.read(MAX_HEARD - len(stale), time.monotonic() + STALE_LOOK_S)
        if not more:
            break
        stale += more
    return stale


def _last_look(port: SerialPort) -> bytes:
    """What comes in within PATIENT_REPLY_S of the sweep's end: replies come late."""
    heard = port.read(MAX_HEARD, time.monotonic() + PATIENT_REPLY_S)
    return heard + _stale(port) if heard else b""


def _exchange(
    port: SerialPort, probe: Probe, protocol: Protocol, timing: LineTiming, timeouts: Timeouts
) -> tuple[bytes, float, int]:
    port.discard_input()
    port.send(probe.frame)
    sent = time.monotonic()
    # The reply's first byte is due a turnaround after the request's last one.
    reply_s = timeouts.reply_s(probe)
    window_ends = sent + timing.chars_s(len(probe.frame)) + reply_s
    raw = port.read(MAX_HEARD, window_ends)
    while raw and len(raw) < MAX_HEARD:
        # Other addresses' late replies come first sometimes: the probe's own may follow
        # them within its window (taking theirs for its reply put the sweep out of step).
        own = raw[others_before(protocol, probe.address, raw) :]
        if own and reply_complete(protocol, probe, own):
            break
        more = port.read(
            MAX_HEARD - len(raw), window_ends if not own else time.monotonic() + timeouts.gap_s
        )
        if not more:
            break  # a reply cut short, or garbage: the line fell quiet
        raw += more
    took_s = time.monotonic() - sent
    # The silent interval before the next request (after a timeout the line has been
    # quiet longer): what comes in it, a second unit's reply, was heard in this window too.
    # Past the reply's own length the line must fall quiet within a reply timeout.
    give_up = time.monotonic() + reply_s
    while raw and len(raw) < MAX_HEARD and time.monotonic() < give_up:
        more = port.read(MAX_HEARD - len(raw), time.monotonic() + timing.silent_s)
        if not more:
            break
        raw += more
    late = 0 if len(raw) < MAX_HEARD else port.wait_for_quiet(timing.silent_s, reply_s)
    return raw, took_s, late


def scan(
    url: str,
    protocol: Protocol,
    addresses: list[int],
    settings: Settings,
    profile: Profile | None,
    reply_timeout_s: float | None = None,
) -> tuple[SweepResult, float, float]:
    """One sweep of `addresses` at `settings` (LinkLost when the port fails): its result,
    how long it took, and the reply timeout a dead address cost."""
    sweep = Sweep(protocol, addresses, settings, profile)
    timeouts = Timeouts(sweep.timing, protocol, reply_timeout_s)
    dead_s = timeouts.reply_s(sweep.presence(addresses[-1]))
    result, elapsed = sweep_port(url, sweep, timeouts)
    return result, elapsed, dead_s


__all__ = ["LinkLost", "PortBusy", "Timeouts", "check_port_free", "holders", "scan"]
