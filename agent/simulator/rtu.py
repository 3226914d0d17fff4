"""Modbus RTU for the fake line: frames and their CRC, requests split out of a byte stream,
and a unit's registers over its thermal model, laid out by the Modbus driver's RegisterMap.

Pure: no I/O, times are passed in. The fake serves RTU itself, apart from the driver's own
codec (agent.controller.modbus_rtu), so that each checks the other; the tests check both
against pymodbus too.
Functions served: 3 and 4 (read holding / input registers: the same registers), 6 and 16
(write the set point register), 17 (report server id) and 43/14 (read device identification,
the basic objects: vendor, product code, revision); the registers of the unit's profile
(agent.controller.sim_profile's by default: 2..7 beside the map's 0 and 1), each written
with its point's own write function only; every other register is read-only.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.controller import line_protocol as lp
from agent.controller.interface import ControllerError, InvalidSetpoint
from agent.controller.modbus_map import (
    READ_HOLDING,
    READ_INPUT,
    WRITE_MULTIPLE,
    WRITE_SINGLE,
    RegisterMap,
)
from agent.controller.modbus_profile import ModbusProfile
from agent.controller.points import InvalidValue
from agent.simulator.core import INVALID, DeviceCore, append_bounded

MAX_FRAME = 256
"""The longest RTU frame (address, PDU of at most 253 bytes, CRC)."""

ILLEGAL_FUNCTION = 1
ILLEGAL_ADDRESS = 2
ILLEGAL_VALUE = 3
DEVICE_FAILURE = 4

MAX_READ = 125
MAX_WRITE = 123
REPORT_SERVER_ID = 17
ENCAPSULATED = 43
READ_DEVICE_ID = 14
RUN_INDICATOR_ON = 0xFF

_KINDS = {
    READ_HOLDING: "READ HOLDING",
    READ_INPUT: "READ INPUT",
    WRITE_SINGLE: "WRITE",
    WRITE_MULTIPLE: "WRITE MULTIPLE",
}


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC_TABLE = _crc_table()


def crc16(data: bytes | bytearray | memoryview) -> int:
    """CRC-16/MODBUS. Over a whole frame (its CRC included) it is 0."""
    crc = 0xFFFF
    table = _CRC_TABLE
    for byte in data:
        crc = (crc >> 8) ^ table[(crc ^ byte) & 0xFF]
    return crc


def with_crc(body: bytes) -> bytes:
    """The frame: body, then its CRC, low byte first."""
    return body + crc16(body).to_bytes(2, "little")


# --- splitting a byte stream into request frames -----------------------------------------


def _request_length(buffer: bytearray, start: int) -> int | None:
    """The length of the request frame at `start`: None if more bytes are needed to tell,
    0 for a function whose requests have no fixed layout."""
    if len(buffer) - start < 2:
        return None
    function = buffer[start + 1]
    if 1 <= function <= 6:
        return 8
    if function in (15, 16):
        if len(buffer) - start < 7:
            return None
        return 9 + buffer[start + 6]
    return 0


def _valid_frame_at(buffer: bytearray, start: int) -> int:
    """The length of a whole request frame with a good CRC at `start`, or 0."""
    if len(buffer) - start >= 2 and (buffer[start] > 247 or buffer[start + 1] >= 0x80):
        # No request starts so: not an address (0 broadcast, 1..247), or not a function
        # (codes from 0x80 up are exception replies). This keeps a run of data bytes with
        # a chance good CRC from passing for a frame of unknown layout.
        return 0
    length = _request_length(buffer, start)
    if length is None:
        return 0
    if length == 0:
        # No fixed layout: the shortest run with a good CRC.
        for end in range(start + 4, min(len(buffer), start + MAX_FRAME) + 1):
            if crc16(memoryview(buffer)[start:end]) == 0:
                return end - start
        return 0
    if len(buffer) - start >= length and crc16(memoryview(buffer)[start : start + length]) == 0:
        return length
    return 0


_UNFIXED = (REPORT_SERVER_ID, ENCAPSULATED)
"""The functions without a fixed request layout that the fake answers."""


class RtuSplitter:
    """Splits the bytes a master sends into request frames. Pure and incremental.

    A real line delimits frames by silence; a pty or a TCP stream has none, so frames are
    told by their function's layout and their CRC. Bytes that start no valid frame (noise,
    a corrupted request) are discarded one at a time until the stream is in step again.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.discarded = 0
        """Bytes discarded so far (noise, corrupted requests)."""

    def feed(self, data: bytes) -> list[bytes | None]:
        frames: list[bytes | None] = []
        buffer = self._buffer
        buffer += data
        while buffer:
            length = _valid_frame_at(buffer, 0)
            if length:
                frames.append(bytes(buffer[:length]))
                del buffer[:length]
                continue
            known = _request_length(buffer, 0)
            complete = known is not None and known != 0 and len(buffer) >= known
            if complete or len(buffer) >= MAX_FRAME or self._later_frame(buffer):
                # Not a frame here: step over one byte and look again.
                del buffer[0]
                self.discarded += 1
                continue
            break  # a frame still arriving
        return frames

    @staticmethod
    def _later_frame(buffer: bytearray) -> bool:
        """Whether a whole valid request ends the buffer, starting after its first byte:
        then what is in front of it is noise or the start of a broken frame, not one still
        arriving (a master waits for the reply to what it sent last). The data bytes of a
        long write still arriving hold many runs of a chance good CRC: a frame of no fixed
        layout counts only with a function the fake answers."""
        for start in range(1, len(buffer) - 3):
            length = _valid_frame_at(buffer, start)
            fixed = _request_length(buffer, start) != 0
            if start + length == len(buffer) and (fixed or buffer[start + 1] in _UNFIXED):
                return True
        return False


# --- requests ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RtuRequest:
    address: int
    """The unit id; 0 is a broadcast (which the fake ignores)."""
    function: int
    start: int
    count: int
    values: tuple[int, ...]
    """The raw values of a write."""
    kind: str
    """READ HOLDING, READ INPUT, WRITE, WRITE MULTIPLE, FUNCTION <n>, or INVALID."""
    frame: bytes


def parse_rtu_request(frame: bytes) -> RtuRequest:
    """The request in a frame with a good CRC (as RtuSplitter gives them)."""
    address, function = frame[0], frame[1]
    kind = _KINDS.get(function, f"FUNCTION {function}")
    start = count = 0
    values: tuple[int, ...] = ()
    if function in (READ_HOLDING, READ_INPUT, WRITE_SINGLE, WRITE_MULTIPLE):
        start = int.from_bytes(frame[2:4], "big")
    if function in (READ_HOLDING, READ_INPUT, WRITE_MULTIPLE):
        count = int.from_bytes(frame[4:6], "big")
    if function == WRITE_SINGLE:
        count, values = 1, (int.from_bytes(frame[4:6], "big"),)
    elif function == WRITE_MULTIPLE:
        data = frame[7:-2]
        if len(data) != 2 * count or not 1 <= count <= MAX_WRITE:
            kind = INVALID
        values = tuple(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    return RtuRequest(address, function, start, count, values, kind, frame)


def exception_reply(address: int, function: int, code: int) -> bytes:
    return with_crc(bytes((address, function | 0x80, code)))


# --- a unit's registers ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisterAccess:
    """One request that reached a unit's registers."""

    at: float
    function_code: int
    address: int
    count: int
    written: tuple[int, ...] | None


class RegisterView:
    """The registers of one unit, read from its device core at the time of the request:
    the register map's, and its profile's (the map's where both have a register)."""

    def __init__(self, register_map: RegisterMap, core: DeviceCore) -> None:
        self.map = register_map
        self.core = core
        self.points = core.profile.modbus
        self.accesses: list[RegisterAccess] = []
        """The last record_limit requests that reached the registers."""

    def registers(self, now: float) -> dict[int, int]:
        """Register number -> raw value, as the unit holds them now."""
        m, core = self.map, self.core
        state = core.state(now)
        values: dict[int, int] = {}
        if self.points is not None:
            held = core.point_values(now)
            for name, spec in self.points.points.items():
                try:
                    values[spec.register] = self.points.encode(name, held[name])
                except InvalidValue:
                    # A value its map has none for (a fan speed a panel chose, say).
                    values[spec.register] = 0xFFFF
        values |= {
            m.setpoint_register: m.encode(state.setpoint),
            m.temperature_register: m.encode(state.temperature),
        }
        if m.output_register is not None:
            values[m.output_register] = state.output or 0
        if m.mode_register is not None and state.mode is not None:
            values[m.mode_register] = m.raw_for_mode(state.mode)
        if m.min_register is not None:
            assert m.max_register is not None and m.step_register is not None
            values[m.min_register] = m.encode(core.limits.min)
            values[m.max_register] = m.encode(core.limits.max)
            values[m.step_register] = m.encode(core.limits.step)
        return values

    def written_point(self, register: int) -> str | None:
        return written_point(self.map, self.points, register)

    def answer(self, request: RtuRequest, now: float, channel: str) -> bytes:
        """The reply frame to a request for this unit."""
        written = request.values if request.function in (WRITE_SINGLE, WRITE_MULTIPLE) else None
        append_bounded(
            self.accesses,
            RegisterAccess(now, request.function, request.start, request.count, written),
            self.core.record_limit,
        )
        address, function = request.address, request.function
        if request.kind == INVALID:
            return exception_reply(address, function, ILLEGAL_VALUE)
        try:
            if function in (READ_HOLDING, READ_INPUT):
                return self._read(request, now)
            if function in (WRITE_SINGLE, WRITE_MULTIPLE):
                return self._write(request, now, channel)
            if function == REPORT_SERVER_ID:
                return self._server_id(request)
            if function == ENCAPSULATED:
                return self._device_id(request)
        except (InvalidSetpoint, ControllerError):
            # A value the map cannot hold (say, a negative temperature, unsigned).
            return exception_reply(address, function, DEVICE_FAILURE)
        return exception_reply(address, function, ILLEGAL_FUNCTION)

    def _read(self, request: RtuRequest, now: float) -> bytes:
        if not 1 <= request.count <= MAX_READ:
            return exception_reply(request.address, request.function, ILLEGAL_VALUE)
        registers = self.registers(now)
        try:
            raw = [registers[r] for r in range(request.start, request.start + request.count)]
        except KeyError:
            return exception_reply(request.address, request.function, ILLEGAL_ADDRESS)
        data = b"".join(value.to_bytes(2, "big") for value in raw)
        return with_crc(bytes((request.address, request.function, len(data))) + data)

    def _server_id(self, request: RtuRequest) -> bytes:
        """Function 17: the model, the firmware and the serial number as the server id, then
        the run indicator, on (last, where clients such as pymodbus read it)."""
        ident = self.core.identity
        data = f"{ident.model} {ident.firmware} {ident.serial}".encode() + bytes(
            (RUN_INDICATOR_ON,)
        )
        return with_crc(bytes((request.address, REPORT_SERVER_ID, len(data))) + data)

    def _device_id(self, request: RtuRequest) -> bytes:
        """Function 43/14, read device identification: the basic objects (0 vendor, 1
        product code, 2 revision) in one reply, whatever object the request starts at."""
        frame = request.frame
        if len(frame) != 7 or frame[2] != READ_DEVICE_ID or frame[3] not in (1, 4):
            return exception_reply(request.address, request.function, ILLEGAL_VALUE)
        ident = self.core.identity
        objects = (ident.model.split("-")[0], ident.model, f"{ident.firmware} {ident.serial}")
        body = bytes((request.address, ENCAPSULATED, READ_DEVICE_ID, frame[3], 0x01, 0, 0, 3))
        for object_id, text in enumerate(objects):
            value = text.encode()
            body += bytes((object_id, len(value))) + value
        return with_crc(body)

    def _write(self, request: RtuRequest, now: float, channel: str) -> bytes:
        point = self.written_point(request.start)
        if point is None or request.count != 1:
            return exception_reply(request.address, request.function, ILLEGAL_ADDRESS)
        if point == "setPoint":
            value = self.map.decode(request.values[0])
            stored = isinstance(self.core.store_setpoint(value, now, channel), lp.SetpointStored)
        else:
            assert self.points is not None
            spec = self.points.point(point)
            if request.function != spec.write_function:
                return exception_reply(request.address, request.function, ILLEGAL_FUNCTION)
            try:
                decoded = self.points.decode(point, request.values[0])
            except InvalidValue:
                return exception_reply(request.address, request.function, ILLEGAL_VALUE)
            stored = self.core.store_point(point, decoded, now, channel) is None
        if not stored:
            return exception_reply(request.address, request.function, ILLEGAL_VALUE)
        if request.function == WRITE_SINGLE:
            return request.frame  # the normal reply echoes the request
        return with_crc(request.frame[:6])


def written_point(
    register_map: RegisterMap, points: ModbusProfile | None, register: int
) -> str | None:
    """The point a write to `register` stores: the map's set point, or the profile's point
    with that register that the agent writes (None: the register is read-only)."""
    if register == register_map.setpoint_register:
        return "setPoint"
    if points is not None:
        for name, spec in points.points.items():
            if spec.register == register and spec.write_function is not None:
                return name
    return None


def written_number(
    register_map: RegisterMap, points: ModbusProfile | None, request: RtuRequest
) -> tuple[str | None, float | None]:
    """The point a write stores, and the number it carries (None for a choice's or a
    switch's, or a register value its map does not give)."""
    if request.function not in (WRITE_SINGLE, WRITE_MULTIPLE) or not request.values:
        return None, None
    point = written_point(register_map, points, request.start)
    if point is None or point == "setPoint" or points is None:
        return point, register_map.decode(request.values[0])
    try:
        value = points.decode(point, request.values[0])
    except InvalidValue:
        return point, None
    return point, value if isinstance(value, float) else None


class RtuDamage:
    """Damage to RTU replies: every kind breaks the CRC, so the master drops the frame."""

    noise = b"\x00\xff"

    def corrupt(self, reply: bytes) -> bytes:
        return reply[:-1] + bytes((reply[-1] ^ 0x01,))

    def wrong_checksum(self, reply: bytes) -> bytes:
        return reply[:-2] + bytes((reply[-2] ^ 0x5A, reply[-1] ^ 0x5A))

    def no_checksum(self, reply: bytes) -> bytes:
        return reply[:-2]

    def readdress(self, reply: bytes, address: int) -> bytes:
        return with_crc(bytes((address,)) + reply[1:-2])


RTU_DAMAGE = RtuDamage()
