"""What every driver offers, and the contract every driver keeps.

A driver owns the port (a device path, or a serial device server's `socket://` or
`rfc2217://` URL) and speaks one protocol to the units on it, each at its address. Its
methods block: the bus (agent.line.bus) calls them one at a time from its own worker
thread. They raise LinkLost when the port itself failed, ControllerUnavailable when the
unit did not answer in time, ControllerError (SetpointRejected for a refused set point)
when it answered wrongly, and WriteNotAllowed when the gate said no; never anything else
for a device fault.

**The gate.** Only the lease holder may put bytes on the line, and a lease ends on its own
deadline whatever the line is doing. So every transaction takes a `gate`, and a driver:

1. does every wait it needs first: a quiet line after a lost reply, the silent interval,
   flushing stale input. Each is bounded;
2. then asks `gate(lasts_s)`, where `lasts_s` is the longest the transaction can take from
   that moment to its end: the write's own bound, the request's line time, the reply
   timeout and the longest reply's line time (`Driver.transaction_s`). False: it raises
   WriteNotAllowed and sends nothing;
3. then writes the request at once: nothing that can wait stands between the gate's yes and
   the first byte. The write itself is bounded (`WRITE_TIMEOUT_S`, counted in `lasts_s`); a
   write that times out aborts the port, so that bytes still queued in the kernel or a
   serial device server's connection are dropped, never sent late (LinkLost).

A transaction that needs two exchanges (Modbus: a write, then the read-back) asks the gate
before each. The caller's gate says yes only when the whole transaction ends before its
lease's deadline (see agent.runtime.agent).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from agent.controller.interface import (
    ControllerError,
    ControllerState,
    ControllerUnavailable,
    DeviceIdentity,
    Limits,
    PointValue,
    WriteNotAllowed,
)
from agent.controller.profile import Profile
from agent.controller.timing import LineTiming, bits_per_char

log = logging.getLogger(__name__)

Gate = Callable[[float], bool]
"""Asked right before a transaction's first byte with how long, at most, the transaction
lasts from then (seconds); True lets it go. It must answer at once and only read state."""

WRITE_TIMEOUT_S = 0.05
"""The longest a driver's write() may block (a frame is tens of bytes: it goes into an empty
kernel buffer at once). Longer means the port is stuck: it is aborted."""


LATE_REPLY_WINDOW = 2
"""Reply timeouts after its own timeout within which a late reply is taken to begin (a unit
up to three reply timeouts late): the next exchange with that address waits that out."""

QUIET_WAIT_AFTER_WINDOW = 3
"""Reply timeouts the wait for a quiet line may go on past that window (a noisy line): it
gives up then, and the reply's address and framing are all that tell it apart."""


Reply = TypeVar("Reply", covariant=True)


class CorruptReply(Exception):
    """Bytes that came as a reply but cannot be read as one (its address unknown)."""


class ReplyReader(Protocol[Reply]):
    """How one protocol reads whole reply frames off the port, one at a time."""

    def clear(self) -> None:
        """Forget any part of a frame read before (the request about to go out makes it
        stale)."""

    def next_reply(self, deadline: float) -> tuple[int | None, Reply] | None:
        """The next whole reply frame, by `deadline` (monotonic): the address it came
        from and the frame. None when none came in time; CorruptReply for one that
        cannot be read."""


class LinePort(Protocol):
    """What an exchange needs of the port (agent.controller.port.SerialPort)."""

    def wait_for_quiet(self, quiet_s: float, at_most_s: float) -> int: ...

    def discard_input(self) -> None: ...

    def send(self, frame: bytes, last_look: Callable[[], bool] | None = None) -> None: ...


def open_gate(lasts_s: float) -> bool:
    """The gate of a master that needs no lease (tests, tools)."""
    return True


class LinkLost(Exception):
    """The port failed (unplugged, connection dropped): close it and reopen it."""


class GateClosed(WriteNotAllowed):
    """The gate said no before the first byte: nothing was sent."""


@dataclass(frozen=True, slots=True)
class Unit:
    """One controller's place on the line."""

    name: str
    address: int | None = None
    """The line protocol's `@<n>` (None: point to point); the Modbus unit id."""
    options: Any = None
    """What else the driver needs for this unit (the Modbus register map)."""
    profile: Profile | None = None
    """Its model's points and how they are kept (None: the set point alone)."""


@dataclass(slots=True)
class LinkStats:
    """What went over the line, for telemetry and figures."""

    transactions: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    timeouts: int = 0
    corrupt_replies: int = 0
    """Checksum or CRC errors, and replies that make no sense."""
    per_unit_timeouts: dict[str, int] = field(default_factory=dict)
    gated: int = 0
    """Transactions the gate refused (nothing sent)."""


class Driver(ABC):
    """One port and the protocol spoken on it. Blocking; one call at a time."""

    url: str
    timing: LineTiming
    reply_timeout_s: float
    stats: LinkStats
    port: LinePort

    def _set_line(
        self,
        url: str,
        *,
        baudrate: int,
        parity: str,
        bytesize: int,
        stopbits: float,
        turnaround_s: float,
        longest_reply: int,
        reply_timeout_s: float | None,
        extra_gap_s: float,
    ) -> None:
        """The line's settings, checked: ValueError at once rather than retries forever."""
        if not url:
            raise ValueError("a serial port URL or device path is required")
        if reply_timeout_s is not None and not reply_timeout_s > 0:
            raise ValueError(f"reply_timeout_s must be > 0, not {reply_timeout_s}")
        if not baudrate > 0:
            raise ValueError(f"baudrate must be > 0, not {baudrate}")
        self.url = url
        self.timing = LineTiming(
            baudrate, bits_per_char(bytesize, parity, stopbits), turnaround_s, extra_gap_s
        )
        self.reply_timeout_s = (
            self.timing.reply_timeout_s(longest_reply)
            if reply_timeout_s is None
            else reply_timeout_s
        )
        self.stats = LinkStats()
        self._late_reply_from: dict[int | None, float] = {}
        """Addresses whose reply may still come, and when their request timed out."""
        self._quiet_since = float("-inf")
        """When the line went quiet (monotonic): the end of the last exchange's reading."""

    def silence_left_s(self) -> float:
        """What is left of the silent interval before the next frame may start. It runs
        from the end of the last exchange's reading, when the reply's last byte had come
        (or its time was up), not from when the work on it ended: that work is line time
        the interval covers already."""
        return self._quiet_since + self.timing.silent_s - time.monotonic()

    # A reply that missed its deadline may still come, and would pass for the reply to
    # the next request to the same address (of the same kind, likely: an old reading
    # taken for a fresh one, and a write decided on it). So the next exchange with that
    # address first waits out the late reply's window (LATE_REPLY_WINDOW reply timeouts
    # from the timeout) and then a quiet line, and keeps doing so until an exchange with it
    # completes: a request the gate held back after the wait does not prove the line quiet
    # by the next one. (Another address's late reply is told apart by its address.) The
    # wait comes before the gate (the contract above).

    def _late_reply_possible(self, address: int | None) -> None:
        self._late_reply_from[address] = time.monotonic()

    def _exchange_completed(self, address: int | None) -> None:
        self._late_reply_from.pop(address, None)

    def _wait_out_late_reply(
        self, wait_for_quiet: Callable[[float, float], int], address: int | None
    ) -> None:
        timed_out_at = self._late_reply_from.get(address)
        if timed_out_at is None:
            return
        window_ends = timed_out_at + LATE_REPLY_WINDOW * self.reply_timeout_s
        quiet_s = max(self.reply_timeout_s, window_ends - time.monotonic())
        discarded = wait_for_quiet(
            quiet_s, quiet_s + QUIET_WAIT_AFTER_WINDOW * self.reply_timeout_s
        )
        if discarded:
            log.debug("discarded %d bytes of a late reply from %s", discarded, address)

    def reply_wait_s(self, request_bytes: int) -> float:
        """How long after the request's write() returns its reply may still begin: the
        request's own line time, then the reply timeout."""
        return self.timing.chars_s(request_bytes) + self.reply_timeout_s

    def _exchange(
        self,
        unit: Unit,
        what: str,
        request: bytes,
        replies: ReplyReader[Reply],
        lasts_s: float,
        gate: Gate,
    ) -> Reply:
        """One request to `unit` and its reply frame, as every protocol has it: the same
        address's late reply waited out, stale input dropped, the gate asked, the request
        sent; then frames read until one from `unit`'s address comes (another unit's
        late reply is discarded and the reading goes on) or the reply's time is up
        (ControllerUnavailable: its reply may still come, late). ControllerError for a
        frame that cannot be read."""
        self._wait_out_late_reply(self.port.wait_for_quiet, unit.address)
        self.port.discard_input()
        replies.clear()
        last_look = self.pass_gate(gate, lasts_s, what)
        self.port.send(request, last_look)
        # The clock starts when write() returns, before the request is on the wire.
        deadline = time.monotonic() + self.reply_wait_s(len(request))
        try:
            while (reply := replies.next_reply(deadline)) is not None:
                address, frame = reply
                if address == unit.address:
                    self._exchange_completed(unit.address)
                    return frame
                # Another unit's late reply (or a point-to-point reply on a bus).
                log.debug("discarded a reply from address %s to %s", address, what)
        except CorruptReply as exc:
            self.stats.corrupt_replies += 1
            raise ControllerError(f"corrupted reply to {what}: {exc}") from exc
        finally:
            self._quiet_since = time.monotonic()
        self._late_reply_possible(unit.address)
        self.stats.timeouts += 1
        self.stats.per_unit_timeouts[unit.name] = self.stats.per_unit_timeouts.get(unit.name, 0) + 1
        raise ControllerUnavailable(f"no reply to {what} within {self.reply_timeout_s:g} s")

    @property
    def longest_late_reply_wait_s(self) -> float:
        """The longest wait for a late reply before an exchange (bounded: the contract)."""
        return (LATE_REPLY_WINDOW + QUIET_WAIT_AFTER_WINDOW) * self.reply_timeout_s

    @property
    @abstractmethod
    def poll_frame(self) -> tuple[int, int]:
        """Bytes of a routine poll's request and reply (for the cycle's line time)."""

    def poll_frames(self, unit: Unit) -> list[tuple[int, int]]:
        """Bytes of each request and reply that reads `unit` once (a unit with a profile
        may take more than the routine poll): for the cycle's line time."""
        return [self.poll_frame]

    def transaction_s(self, request: int, longest_reply: int) -> float:
        """The longest a transaction can take from its gate to its end: the bounded write,
        the request's line time, then the reply timeout (counted from the request's end)
        and the longest reply's line time."""
        return WRITE_TIMEOUT_S + self.timing.chars_s(request + longest_reply) + self.reply_timeout_s

    @property
    def longest_transaction_s(self) -> float:
        """The longest any one transaction of this driver can take (what a lease must
        cover for the gate to let it go)."""
        return self.transaction_s(*self.poll_frame)

    def pass_gate(self, gate: Gate, lasts_s: float, what: str) -> Callable[[], bool]:
        """Step 2 of the contract: GateClosed unless the gate lets a transaction of
        `lasts_s` go now. Returns the same question for the port to ask once more right
        before the first byte (SerialPort.send): a process paused between the two (frozen,
        or its thread descheduled with a pause coming) must not write after its lease."""
        if not gate(lasts_s):
            self.stats.gated += 1
            raise GateClosed(f"{what}: not sent (the lease would not cover it)")

        def last_look() -> bool:
            if gate(lasts_s):
                return True
            self.stats.gated += 1
            return False

        return last_look

    @property
    def worst_case_call_s(self) -> float:
        """The longest one call may block: the bus's bound on a stuck worker."""
        # Two exchanges (a write and its read-back), each after a wait for a late reply.
        return max(6.0, 2 * (self.longest_late_reply_wait_s + 2 * self.reply_timeout_s))

    @abstractmethod
    def open(self) -> None:
        """Open the port (LinkLost if it cannot be)."""

    @abstractmethod
    def close(self) -> None:
        """Close the port; must not raise."""

    @abstractmethod
    def read_state(self, unit: Unit, gate: Gate = open_gate) -> ControllerState: ...

    @abstractmethod
    def read_limits(self, unit: Unit, gate: Gate = open_gate) -> Limits: ...

    @abstractmethod
    def write_setpoint(self, unit: Unit, value: float, gate: Gate = open_gate) -> float:
        """Write `value`; return what the controller holds afterwards (its read-back)."""

    def write_point(
        self, unit: Unit, point: str, value: PointValue, gate: Gate = open_gate
    ) -> PointValue:
        """Write one point (agent.controller.points) and return its read-back. The set
        point is `write_setpoint`; the others need a profile that says how."""
        if point == "setPoint":
            assert isinstance(value, int | float) and not isinstance(value, bool)
            return self.write_setpoint(unit, value, gate)
        raise ControllerError(f"{unit.name}: its profile does not say how to write {point}")

    def identify(self, unit: Unit, gate: Gate = open_gate) -> DeviceIdentity | None:
        """The unit's model, firmware and serial number, if the protocol can tell."""
        return None


def is_device_path(url: str) -> bool:
    """True for a local device path; False for a pyserial URL such as socket://."""
    return "://" not in url


class PortClaim:
    """A claim on a local serial port for the life of a process, so that two lines
    configured on one gateway never open the same port (through two names for it).

    An flock()ed file named after the port's real path, in a directory every agent on the
    gateway shares (/run/lock); the kernel drops the claim when the process ends.
    """

    def __init__(self, url: str, directory: Path) -> None:
        self.url = url
        self.real_path = os.path.realpath(url)
        digest = hashlib.sha256(self.real_path.encode()).hexdigest()[:16]
        name = Path(self.real_path).name or "port"
        self.path = directory / f"agent-{name}-{digest}.lock"
        self._fd: int | None = None

    def take(self) -> None:
        """Raises PortTaken when another process holds the claim."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = ""
            with contextlib.suppress(OSError):
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            raise PortTaken(
                f"{self.url} ({self.real_path}) is already served by another agent"
                + (f" ({holder})" if holder else "")
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @classmethod
    def of(cls, url: str | None, directory: Path | None) -> PortClaim | None:
        """The claim taken on a local port (None: not a local port, no directory set, or
        none to write to, which is said). Raises PortTaken."""
        if not url or not is_device_path(url) or directory is None:
            return None
        claim = cls(url, directory)
        try:
            claim.take()
        except OSError as exc:  # no lock directory to write to: say so, carry on
            log.warning("cannot claim %s in %s: %s", url, directory, exc)
            return None
        return claim


class PortTaken(Exception):
    """Another agent on this gateway serves the same port."""
