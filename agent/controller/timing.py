"""The timing of a serial line, from its settings alone. Pure.

A character on the wire is a start bit, the data bits, an optional parity bit and the stop
bits. Modbus RTU separates frames by a silent interval of 3.5 character times, fixed at
1.75 ms above 19200 baud (Modbus over Serial Line, §2.5.1.1); the ASCII line protocol
keeps the same gap, so that a slow device has the line quiet before the next request.
"""

from __future__ import annotations

from dataclasses import dataclass

FAST_LINE_BAUD = 19_200
FAST_LINE_SILENT_S = 0.00175
TYPICAL_TURNAROUND_S = 0.005
"""How long a thermostat usually takes before it answers (a few milliseconds): what the
cycle's line time counts for each reply, where the reply timeout allows for far more."""


@dataclass(frozen=True, slots=True)
class LineTiming:
    baudrate: int
    bits_per_char: int
    turnaround_s: float
    """How long a device may take before it starts its reply."""
    extra_gap_s: float = 0.0
    """Added to the silent interval, for slow devices."""

    def __post_init__(self) -> None:
        if self.baudrate <= 0 or self.bits_per_char <= 0:
            raise ValueError("baud rate and bits per character must be positive")
        if self.turnaround_s < 0 or self.extra_gap_s < 0:
            raise ValueError("turnaround and extra gap must not be negative")

    def chars_s(self, count: int) -> float:
        """Line time of `count` characters."""
        return count * self.bits_per_char / self.baudrate

    @property
    def silent_s(self) -> float:
        """The quiet time after every reply or timeout, before the next frame."""
        rtu = FAST_LINE_SILENT_S if self.baudrate > FAST_LINE_BAUD else self.chars_s(1) * 3.5
        return rtu + self.extra_gap_s

    def reply_timeout_s(self, longest_reply: int) -> float:
        """How long to wait for a reply: the device's turnaround and the longest reply's
        line time, with room for a loaded gateway (twice that, and at least 50 ms)."""
        return max(0.05, 2 * (self.turnaround_s + self.chars_s(longest_reply)))

    def transaction_s(self, request: int, reply: int) -> float:
        """One transaction's line time: request, a typical turnaround, the reply and the
        silence after it. (A device may take up to `turnaround_s` to answer.)"""
        return self.chars_s(request) + TYPICAL_TURNAROUND_S + self.chars_s(reply) + self.silent_s


def bits_per_char(bytesize: int, parity: str, stopbits: float) -> int:
    return 1 + bytesize + (0 if parity == "N" else 1) + round(stopbits)


def cycle_s(timing: LineTiming, devices: int, request: int, reply: int) -> float:
    """A poll cycle's line time: one read of every device."""
    return devices * timing.transaction_s(request, reply)
