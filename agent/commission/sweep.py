"""A bus scan's decisions: what to send next, what a reply means, what was found. Pure.

A sweep goes address by address. Each address gets a presence probe with a short reply
(the line protocol's `GET SP`; on Modbus a read of the profile's first register, which any
unit answers, if only with an exception), so that a dead address costs little. What comes
back in the reply window is heard as an answer, a refusal (the unit is there and says no),
silence, garbage, or two replies. Silence ends the address at once: a dead address costs
one reply timeout; a reply that comes after its timeout (heard before the next request, or
in the next reply window) has its address probed again at the end, patiently, and reported
late. Garbage is probed again: garbage every time (or two replies at once) is a collision,
two units answering at one address; garbage once is noise. A unit found is then asked what
it says of itself (the line protocol's `ID`; Modbus: device identification 43/14, else
report server id 17) and which of the profile's points it answers (the line protocol:
`GET POINTS`; Modbus: the profile's reads, register by register where a block read is
refused), and asked once more where it went silent.

The sweep keeps the line's floor too: every request's and reply's line time, a typical
turnaround and the silent interval, as the line's timing (agent.controller.timing) gives
them: what no master could do the same sweep faster than.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Literal

from agent.controller import line_protocol as lp
from agent.controller import modbus_ident as ident
from agent.controller import modbus_rtu as rtu
from agent.controller.modbus_map import READ_HOLDING, plan_reads
from agent.controller.profile import Profile
from agent.controller.timing import TYPICAL_TURNAROUND_S, LineTiming, bits_per_char

Protocol = Literal["line", "modbus"]

PRESENCE_ATTEMPTS = 2
"""Probes of an address that answered garbage: garbage each time is a collision."""
PATIENT_REPLY_S = 1.0
"""The reply timeout of an address whose reply came late: a unit slower still is no use."""
FOLLOW_UP_ATTEMPTS = 2
"""Asks of a unit found that went silent: it answered a moment ago."""
DEFAULT_POINTS = {"setPoint": (READ_HOLDING, 0), "temperature": (READ_HOLDING, 1)}
"""A Modbus unit without a profile: the driver's default register map."""


@dataclass(frozen=True, slots=True)
class Settings:
    """A line's character framing and speed."""

    baudrate: int
    parity: str = "N"
    bytesize: int = 8
    stopbits: int = 1

    def timing(self, turnaround_s: float = TYPICAL_TURNAROUND_S) -> LineTiming:
        bits = bits_per_char(self.bytesize, self.parity, self.stopbits)
        return LineTiming(self.baudrate, bits, turnaround_s)

    def __str__(self) -> str:
        return f"{self.baudrate} {self.bytesize}{self.parity}{self.stopbits}"


class Step(StrEnum):
    PRESENCE = "presence"
    DEVICE_ID = "device identification"
    SERVER_ID = "server id"
    POINTS = "points"
    READ_ONE = "register"


@dataclass(frozen=True, slots=True)
class Probe:
    address: int
    step: Step
    frame: bytes
    attempt: int = 1
    registers: tuple[tuple[str, int, int], ...] = ()
    """Modbus reads: the (point, function, register) the read covers."""
    patient: bool = False
    """An address whose reply came late: its reply gets a long wait (PATIENT_REPLY_S). Set
    by next_probe(), the one place a probe is handed out."""


class Heard(StrEnum):
    ANSWER = "answer"
    REFUSED = "refused"
    SILENT = "silent"
    GARBLED = "garbled"
    DOUBLED = "doubled"


@dataclass(frozen=True, slots=True)
class Hearing:
    heard: Heard
    text: str = ""
    """What the unit said (its reply's payload, its identification)."""
    points: tuple[str, ...] = ()
    """The points the reply holds."""
    noise: int = 0
    """Bytes beside the reply that belong to none."""


@dataclass(slots=True)
class Found:
    address: int
    identity: str | None = None
    points: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    reply_s: float = 0.0
    """The presence probe's reply time: from the request sent to the reply's last byte."""
    noise: int = 0


@dataclass(slots=True)
class SweepResult:
    settings: Settings
    found: list[Found] = field(default_factory=list)
    collisions: list[int] = field(default_factory=list)
    noisy: list[int] = field(default_factory=list)
    """Addresses where garbage was heard once and nothing answered."""
    late: list[int] = field(default_factory=list)
    """Addresses whose reply came after the reply timeout: each was probed again."""
    probes: int = 0
    floor_s: float = 0.0
    noise_bytes: int = 0


def judge(hearings: list[Heard]) -> Literal["present", "collision", "noise", "absent", "again"]:
    """What the presence probes of one address heard, so far, mean ("again": probe once
    more)."""
    if Heard.DOUBLED in hearings:
        return "collision"
    if Heard.ANSWER in hearings or Heard.REFUSED in hearings:
        return "present"
    if hearings and all(h is Heard.GARBLED for h in hearings):
        return "collision" if len(hearings) >= PRESENCE_ATTEMPTS else "again"
    if Heard.GARBLED in hearings:
        return "noise"
    return "absent"


class Sweep:
    """One sweep of `addresses` at one setting of the line. next_probe(), send it, then
    record() what came back, until next_probe() says None."""

    def __init__(
        self,
        protocol: Protocol,
        addresses: list[int],
        settings: Settings,
        profile: Profile | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("no addresses to scan")
        self.protocol = protocol
        self.profile = profile
        self.timing = settings.timing()
        self.result = SweepResult(settings)
        self._addresses = deque(lp.check_address(a) for a in addresses)
        self._queue: deque[Probe] = deque()
        self._heard: list[Heard] = []
        self._found: Found | None = None
        self._address = 0
        self._unanswered: set[int] = set()
        """Addresses swept where a probe went unanswered."""

    # --- what to send ----------------------------------------------------------------

    def next_probe(self) -> Probe | None:
        if not self._queue:
            self._finish_address()
            if not self._addresses:
                return None
            self._address = self._addresses.popleft()
            self._queue.append(self.presence(self._address))
        head = self._queue[0]
        if head.address in self.result.late and not head.patient:
            head = self._queue[0] = replace(head, patient=True)
        return head

    def presence(self, address: int, attempt: int = 1) -> Probe:
        if self.protocol == "line":
            frame = _line(address, lp.GetSetpoint())
        else:
            function, register = self._modbus_points()[0][1:]
            frame = rtu.read_request(address, function, register, 1)
        return Probe(address, Step.PRESENCE, frame, attempt)

    def _modbus_points(self) -> list[tuple[str, int, int]]:
        if self.profile is not None and self.profile.modbus is not None:
            return [
                (name, spec.read_function, spec.register)
                for name, spec in self.profile.modbus.points.items()
            ]
        return [(name, f, r) for name, (f, r) in DEFAULT_POINTS.items()]

    def _follow_ups(self, address: int) -> list[Probe]:
        if self.protocol == "line":
            if self.profile is not None and self.profile.line is not None:
                request: lp.Request = lp.GetPoints()
            else:
                request = lp.GetState()
            return [
                Probe(address, Step.DEVICE_ID, _line(address, lp.Identify())),
                Probe(address, Step.POINTS, _line(address, request)),
            ]
        probes = [Probe(address, Step.DEVICE_ID, ident.device_id_request(address))]
        points = self._modbus_points()
        if self.profile is not None and self.profile.modbus is not None:
            reads = self.profile.modbus.reads()
        else:
            reads = plan_reads((f, r) for _, f, r in points)
        for function, first, count in reads:
            covered = tuple(p for p in points if p[1] == function and first <= p[2] < first + count)
            frame = rtu.read_request(address, function, first, count)
            probes.append(Probe(address, Step.POINTS, frame, registers=covered))
        return probes

    # --- what came back --------------------------------------------------------------

    def record(self, probe: Probe, raw: bytes, took_s: float, late: int = 0) -> Hearing:
        """`raw`: every byte heard in the probe's reply window; `took_s`: from the request
        sent to the last byte; `late`: bytes that came after it, in the silent interval."""
        if not self._queue or self._queue[0] != probe:
            raise ValueError("record() the probe next_probe() gave")
        self._queue.popleft()
        # Late replies to earlier probes first, then (maybe) this probe's own.
        others = others_before(self.protocol, probe.address, raw)
        hearing = hear(self.protocol, probe, raw[others:])
        if hearing.heard is Heard.SILENT:
            self._unanswered.add(probe.address)
        if others or hearing.heard is not Heard.SILENT:
            self.heard_late(raw, besides=probe.address)  # an earlier reply, come later still
        result = self.result
        result.probes += 1
        result.floor_s += self.timing.transaction_s(len(probe.frame), len(raw))
        noise = hearing.noise + late
        result.noise_bytes += noise
        if probe.step is Step.PRESENCE:
            self._presence_heard(probe, hearing, took_s, noise)
        elif self._found is not None:
            self._found.noise += noise
            self._follow_up_heard(probe, hearing)
        return hearing

    def _presence_heard(self, probe: Probe, hearing: Hearing, took_s: float, noise: int) -> None:
        self._heard.append(hearing.heard)
        verdict = judge(self._heard)
        if verdict == "again":
            self._queue.append(self.presence(probe.address, probe.attempt + 1))
        elif verdict == "present":
            self._found = Found(probe.address, reply_s=took_s, noise=noise)
            self._queue.extend(self._follow_ups(probe.address))

    @property
    def unanswered(self) -> bool:
        """Whether a probe went unanswered whose address was not probed again."""
        return bool(self._unanswered - set(self.result.late))

    def heard_late(self, raw: bytes, besides: int | None = None) -> list[int]:
        """`raw`: bytes that came in after a reply window closed, before the next request.
        Each address swept whose probe went unanswered and whose reply is among them is
        probed again at the end of the sweep (once): those addresses."""
        again = [
            a
            for a in dict.fromkeys(reply_addresses(self.protocol, raw))
            if a in self._unanswered and a not in self.result.late and a != besides
        ]
        for address in again:
            self.result.late.append(address)
            self._addresses.append(address)
        return again

    def _follow_up_heard(self, probe: Probe, hearing: Hearing) -> None:
        found = self._found
        assert found is not None
        answered = hearing.heard is Heard.ANSWER
        if hearing.heard is Heard.SILENT and probe.attempt < FOLLOW_UP_ATTEMPTS:
            self._queue.appendleft(replace(probe, attempt=probe.attempt + 1))
            return
        if probe.step is Step.DEVICE_ID:
            if answered:
                found.identity = hearing.text
            elif self.protocol == "modbus":
                self._queue.appendleft(
                    Probe(probe.address, Step.SERVER_ID, ident.server_id_request(probe.address))
                )
        elif probe.step is Step.SERVER_ID:
            if answered:
                found.identity = hearing.text
        elif self.protocol == "line":
            names = self._line_names()
            found.points = [p for p, n in names.items() if answered and n in hearing.points]
            found.missing = [p for p in names if p not in found.points]
        elif answered:
            found.points += [name for name, _, _ in probe.registers]
        elif probe.step is Step.POINTS and len(probe.registers) > 1:
            # A block read refused: one register at a time tells which it lacks.
            singles = [
                Probe(
                    probe.address,
                    Step.READ_ONE,
                    rtu.read_request(probe.address, function, register, 1),
                    registers=((name, function, register),),
                )
                for name, function, register in probe.registers
            ]
            self._queue.extendleft(reversed(singles))
        else:
            found.missing += [name for name, _, _ in probe.registers]

    def _line_names(self) -> dict[str, str]:
        """The points a unit should answer, with their names on the line."""
        if self.profile is not None and self.profile.line is not None:
            return {point: spec.name for point, spec in self.profile.line.points.items()}
        return {"setPoint": "SP", "temperature": "T"}

    def _finish_address(self) -> None:
        if not self._heard:
            return
        address = self._address
        verdict = judge(self._heard)
        if verdict == "collision":
            if address not in self.result.collisions:
                self.result.collisions.append(address)
        elif verdict == "noise" and address not in self.result.noisy:
            self.result.noisy.append(address)
        if self._found is not None:
            found = [f for f in self.result.found if f.address != address]
            self.result.found = sorted([*found, self._found], key=lambda f: f.address)
            if address in self.result.noisy and verdict == "present":
                self.result.noisy.remove(address)
        self._heard = []
        self._found = None


def _line(address: int, request: lp.Request) -> bytes:
    return lp.encode_line(lp.with_address(address, lp.format_request(request)))


# --- hearing a reply -------------------------------------------------------------------


LONGEST_SETPOINT_REPLY = len(lp.encode_line("@247 SP -100.0"))
LONGEST_LINE_REPLY = lp.MAX_LINE + len(lp.TERMINATOR)
LONGEST_RTU_FRAME = 256


def longest_reply(protocol: Protocol, probe: Probe) -> int:
    """The most bytes the probe's reply can take: its line time is part of the wait for the
    reply (a serial device server may pass a reply on only once it is whole)."""
    if protocol == "line":
        return LONGEST_SETPOINT_REPLY if probe.step is Step.PRESENCE else LONGEST_LINE_REPLY
    if probe.step in (Step.DEVICE_ID, Step.SERVER_ID):
        return LONGEST_RTU_FRAME
    return rtu.reply_bytes(probe.frame)


def reply_complete(protocol: Protocol, probe: Probe, raw: bytes) -> bool:
    """Whether `raw` holds a whole reply (then the scan need not wait for the line to fall
    quiet, only for the silent interval, in which a second reply would show)."""
    if protocol == "line":
        return raw.endswith(b"\n")
    if len(raw) >= 2 and raw[1] & rtu.EXCEPTION_FLAG:
        return len(raw) >= rtu.EXCEPTION_REPLY_BYTES
    if probe.step is Step.SERVER_ID:
        return len(raw) >= 3 and len(raw) >= 5 + raw[2]
    if probe.step is Step.DEVICE_ID:
        try:
            ident.parse_device_id(probe.frame, raw)
        except rtu.FrameError:
            return False
        return True
    length = rtu.reply_length(raw[: rtu.HEADER_BYTES])
    return length is not None and len(raw) >= length


def others_before(protocol: Protocol, address: int, raw: bytes) -> int:
    """How many of `raw`'s first bytes are whole, valid replies from other addresses: late
    replies to earlier probes, come in this probe's window before its own reply."""
    start = 0
    if protocol == "line":
        while (end := raw.find(b"\n", start)) >= 0:
            replies = _line_replies(raw[start : end + 1])
            if not replies or replies[0][0] in (None, address):
                break
            start = end + 1
        return start
    while start + rtu.HEADER_BYTES <= len(raw):
        length = rtu.reply_length(raw[start : start + rtu.HEADER_BYTES])
        frame = raw[start : start + length] if length else b""
        if not length or len(frame) < length or rtu.crc(frame) != 0 or frame[0] == address:
            break
        start += length
    return start


def reply_addresses(protocol: Protocol, raw: bytes) -> list[int]:
    """The addresses of the whole, valid replies among `raw` (a line's checksummed replies;
    Modbus frames whose CRC holds), in order."""
    if protocol == "line":
        return [address for address, _, _ in _line_replies(raw) if address is not None]
    found: list[int] = []
    start = 0
    while start + rtu.HEADER_BYTES <= len(raw):
        length = rtu.reply_length(raw[start : start + rtu.HEADER_BYTES])
        candidate = raw[start : start + length] if length else b""
        if length and len(candidate) == length and rtu.crc(candidate) == 0:
            found.append(candidate[0])
            start += length
        else:
            start += 1
    return found


def hear(protocol: Protocol, probe: Probe, raw: bytes) -> Hearing:
    """What the bytes heard in a probe's reply window are."""
    if not raw:
        return Hearing(Heard.SILENT)
    if protocol == "line":
        return _hear_line(probe, raw)
    return _hear_modbus(probe, raw)


def _line_replies(raw: bytes) -> list[tuple[int | None, str, int]]:
    """Each line of `raw` as (address, payload, length): the address None for a line that is
    noise or holds no valid checksummed reply."""
    lines: list[tuple[int | None, str, int]] = []
    for line in raw.split(b"\n"):
        address, payload = None, ""
        if line.strip(b"\r\n\x00 "):
            try:
                frame = lp.salvage_reply(line)
                if frame is not None:
                    address, payload = lp.split_address(frame.payload)
            except lp.ProtocolError:
                address = None
        lines.append((address, payload, len(line)))
    return lines


def _hear_line(probe: Probe, raw: bytes) -> Hearing:
    replies: list[str] = []
    noise = 0
    for address, payload, length in _line_replies(raw):
        if address != probe.address:
            noise += length  # noise, garbage, or another address's reply
            continue
        replies.append(payload)
    if len(replies) > 1:
        return Hearing(Heard.DOUBLED, " | ".join(replies), noise=noise)
    if not replies:
        return Hearing(Heard.GARBLED, noise=0)
    try:
        reply = lp.parse_reply(replies[0])
    except lp.ProtocolError:
        return Hearing(Heard.GARBLED, replies[0], noise=noise)
    if isinstance(reply, lp.ErrorReply):
        return Hearing(Heard.REFUSED, replies[0], noise=noise)
    text, points = replies[0], tuple[str, ...]()
    if isinstance(reply, lp.IdReply):
        text = f"{reply.model} {reply.firmware} {reply.serial}"
    elif isinstance(reply, lp.PointsReply):
        points = tuple(name for name, _ in reply.fields)
    elif isinstance(reply, lp.StateReply):
        points = ("SP", "T")
    return Hearing(Heard.ANSWER, text, points, noise)


def _hear_modbus(probe: Probe, raw: bytes) -> Hearing:
    if probe.step in (Step.DEVICE_ID, Step.SERVER_ID):
        try:
            if probe.step is Step.DEVICE_ID:
                objects = ident.parse_device_id(probe.frame, raw)
                if isinstance(objects, rtu.ExceptionReply):
                    return Hearing(Heard.REFUSED, f"exception {objects.code}")
                return Hearing(Heard.ANSWER, ident.describe_device_id(objects))
            server = ident.parse_server_id(probe.frame, raw)
        except rtu.FrameError:
            return Hearing(Heard.GARBLED)
        if isinstance(server, rtu.ExceptionReply):
            return Hearing(Heard.REFUSED, f"exception {server.code}")
        return Hearing(Heard.ANSWER, server)
    length = rtu.reply_length(raw[: rtu.HEADER_BYTES])
    if length is None or len(raw) < length:
        return Hearing(Heard.GARBLED)
    try:
        answer = rtu.parse_reply(probe.frame, raw[:length])
    except rtu.FrameError:
        return Hearing(Heard.GARBLED)
    rest = raw[length:]
    if rest:
        try:
            rtu.parse_reply(probe.frame, rest[:length])
            return Hearing(Heard.DOUBLED, noise=len(rest) - length)
        except rtu.FrameError:
            pass
    if isinstance(answer, rtu.ExceptionReply):
        return Hearing(Heard.REFUSED, f"exception {answer.code}", noise=len(rest))
    return Hearing(Heard.ANSWER, " ".join(map(str, answer or [])), noise=len(rest))
