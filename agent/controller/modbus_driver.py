"""The Modbus RTU driver: thermostats and HVAC controllers on RS-485, through pyserial.

Requests and replies are built and checked by `modbus_rtu` (pure); the register map is
`modbus_map`'s. Every reply is read by its known length as it arrives, so a transaction
costs its line time: the request, the unit's turnaround, the reply, and the silent
interval the bus keeps after it. No retries: a unit that does not answer costs one reply
timeout. A write is read back (the echo of a write is no read-back).

A unit with a profile (its `modbus` map, agent.controller.modbus_profile) is read whole in
as few requests as its registers allow (one, when they are close and of one function), and
written point by point with the point's own write function, then read back; its register
map (`options`) gives only its unit id. One without reads the register map, as always.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from agent.controller import modbus_rtu as rtu
from agent.controller.driver import CorruptReply, Driver, Gate, Unit, open_gate
from agent.controller.interface import (
    ControllerError,
    ControllerState,
    InvalidSetpoint,
    Limits,
    PointValue,
    SetpointRejected,
)
from agent.controller.modbus_map import (
    ILLEGAL_DATA_VALUE,
    MAX_SPAN,
    READ_HOLDING,
    READ_INPUT,
    WRITE_MULTIPLE,
    WRITE_SINGLE,
    RegisterMap,
    plan_reads,
)
from agent.controller.modbus_profile import ModbusProfile
from agent.controller.points import InvalidValue
from agent.controller.port import SerialPort

__all__ = [
    "READ_HOLDING",
    "READ_INPUT",
    "WRITE_MULTIPLE",
    "WRITE_SINGLE",
    "ModbusDriver",
    "ModbusRefused",
    "RegisterMap",
    "plan_reads",
]

log = logging.getLogger(__name__)

TURNAROUND_S = 0.1
"""How long a Modbus controller may take before it answers (no standard figure; devices
commonly answer within tens of milliseconds)."""

# Read holding registers, request and reply for two registers: the routine poll.
POLL_REQUEST_BYTES = 8
POLL_REPLY_BYTES = 5 + 2 * 2
LONGEST_REPLY_BYTES = 5 + 2 * MAX_SPAN
NETWORK_GAP_S = 0.02
"""The least inter-character timeout: a serial device server's TCP may split a frame."""


class ModbusRefused(ControllerError):
    """The controller answered with a Modbus exception response."""

    def __init__(self, message: str, exception_code: int | None) -> None:
        super().__init__(message)
        self.exception_code = exception_code


class ModbusDriver(Driver):
    """Controllers speaking Modbus RTU; each unit's `options` is its RegisterMap (its
    address the unit id), or None for the default map."""

    def __init__(
        self,
        url: str,
        *,
        baudrate: int = 19200,
        parity: str = "E",
        bytesize: int = 8,
        stopbits: int = 1,
        reply_timeout_s: float | None = None,
        extra_gap_s: float = 0.0,
    ) -> None:
        self._set_line(
            url,
            baudrate=baudrate,
            parity=parity,
            bytesize=bytesize,
            stopbits=stopbits,
            turnaround_s=TURNAROUND_S,
            longest_reply=LONGEST_REPLY_BYTES,
            reply_timeout_s=reply_timeout_s,
            extra_gap_s=extra_gap_s,
        )
        self.port = SerialPort(
            url, self.stats, baudrate=baudrate, parity=parity, bytesize=bytesize, stopbits=stopbits
        )
        self._maps: dict[str, tuple[Unit, RegisterMap, list[tuple[int, int, int]]]] = {}
        """Each unit's register map and the reads of its state, made once (a poll is the
        most frequent thing the agent does)."""
        # The end of a frame cut short: the line quiet for 1.5 character times (RTU's
        # inter-character timeout), or a network's hiccup, whichever is longer.
        self.gap_s = max(self.timing.chars_s(2), NETWORK_GAP_S)
        self._replies = RtuReplies(self.port, self.gap_s)

    @property
    def poll_frame(self) -> tuple[int, int]:
        return POLL_REQUEST_BYTES, POLL_REPLY_BYTES

    @property
    def longest_transaction_s(self) -> float:
        # A write of one register with function 16 is the longest request.
        return self.transaction_s(11, LONGEST_REPLY_BYTES)

    # --- the port ---------------------------------------------------------------------

    def open(self) -> None:
        self.port.open()
        self._late_reply_from.clear()

    def close(self) -> None:
        self.port.close()

    # --- transactions -----------------------------------------------------------------

    @staticmethod
    def register_map(unit: Unit) -> RegisterMap:
        options = unit.options if isinstance(unit.options, RegisterMap) else RegisterMap()
        if unit.address is not None and unit.address != options.unit_id:
            options = dataclasses.replace(options, unit_id=unit.address)
        return options

    def _unit_map(self, unit: Unit) -> tuple[RegisterMap, list[tuple[int, int, int]]]:
        """The unit's register map and the reads that take its state."""
        known = self._maps.get(unit.name)
        if known is None or known[0] is not unit:
            m = self.register_map(unit)
            known = self._maps[unit.name] = (unit, m, plan_reads(_state_registers(m)))
        return known[1], known[2]

    def _transact(
        self, unit: Unit, what: str, request: bytes, gate: Gate
    ) -> tuple[int, ...] | None:
        """One request and its reply: the registers read, or None for a write's echo."""
        lasts_s = self.transaction_s(len(request), rtu.reply_bytes(request))
        reply = self._exchange(unit, what, request, self._replies, lasts_s, gate)
        try:
            answer = rtu.parse_reply(request, reply)
        except rtu.FrameError as exc:
            self.stats.corrupt_replies += 1
            raise ControllerError(f"{what}: {exc}") from exc
        if isinstance(answer, rtu.ExceptionReply):
            raise ModbusRefused(
                f"controller refused {what}: Modbus exception {answer.code}", answer.code
            )
        return answer

    def _read_registers(
        self,
        unit: Unit,
        wanted: list[tuple[int, int]],
        gate: Gate,
        reads: list[tuple[int, int, int]] | None = None,
    ) -> dict[tuple[int, int], int]:
        """The registers wanted, by (function, register): read as `reads` (function, first,
        count) plan it, or joined as plan_reads does."""
        values: dict[tuple[int, int], int] = {}
        unit_id = self._unit_map(unit)[0].unit_id
        plan = plan_reads(wanted) if reads is None else reads
        for index, (function, first, count) in enumerate(plan):
            if index:
                self._silent_interval()
            what = f"read of {count} register(s) at {first} (function {function})"
            registers = self._transact(
                unit, what, rtu.read_request(unit_id, function, first, count), gate
            )
            if registers is None or len(registers) < count:
                raise ControllerError(f"{what}: got {registers!r}")
            for offset in range(count):
                values[(function, first + offset)] = registers[offset]
        return values

    def _silent_interval(self) -> None:
        """Between two exchanges of one call: the line quiet for what is left of the silent
        interval. (An Event's timed wait: a sleep's absolute deadline is what libfaketime
        breaks.)"""
        left = self.silence_left_s()
        if left > 0:
            threading.Event().wait(left)

    def poll_frames(self, unit: Unit) -> list[tuple[int, int]]:
        points = _modbus_map(unit)
        return [self.poll_frame] if points is None else points.poll_frames()

    def read_state(self, unit: Unit, gate: Gate = open_gate) -> ControllerState:
        points = _modbus_map(unit)
        if points is not None:
            return self._read_points(unit, points, gate)
        m, reads = self._unit_map(unit)
        values = self._read_registers(unit, [], gate, reads)
        output: int | None = None
        if m.output_register is not None:
            output = values[(m.status_function, m.output_register)]
            if output > 100:
                raise ControllerError(f"output {output} % is over 100")
        mode = None
        if m.mode_register is not None:
            mode = m.mode_for(values[(m.status_function, m.mode_register)])
        return ControllerState(
            setpoint=m.decode(values[(m.read_function, m.setpoint_register)]),
            temperature=m.decode(values[(m.status_function, m.temperature_register)]),
            output=output,
            mode=mode,
        )

    def _read_points(self, unit: Unit, points: ModbusProfile, gate: Gate) -> ControllerState:
        wanted = [(spec.read_function, spec.register) for spec in points.points.values()]
        registers = self._read_registers(unit, wanted, gate, points.reads())
        try:
            values = points.decode_all(registers)
        except InvalidValue as exc:
            raise ControllerError(f"{unit.name}: {exc}") from exc
        setpoint, temperature = values.pop("setPoint"), values["temperature"]
        assert isinstance(setpoint, float) and isinstance(temperature, float)
        return ControllerState(setpoint, temperature, None, None, values)

    def read_limits(self, unit: Unit, gate: Gate = open_gate) -> Limits:
        if unit.profile is not None and unit.profile.modbus is not None:
            limits = unit.profile.limits("setPoint")
            assert limits is not None  # a profile's checks say so
            return limits
        m = self._unit_map(unit)[0]
        if m.limits is not None:
            return m.limits
        assert m.min_register is not None and m.max_register is not None
        assert m.step_register is not None
        registers = (m.min_register, m.max_register, m.step_register)
        values = self._read_registers(unit, [(m.read_function, r) for r in registers], gate)
        low, high, step = (m.decode(values[(m.read_function, r)]) for r in registers)
        try:
            return Limits(low, high, step)
        except ValueError as exc:
            raise ControllerError(f"nonsense limits: {exc}") from exc

    def read_setpoint(self, unit: Unit, gate: Gate = open_gate) -> float:
        if _modbus_map(unit) is not None:
            value = self._read_point(unit, "setPoint", gate)
            assert isinstance(value, float)
            return value
        m = self._unit_map(unit)[0]
        values = self._read_registers(unit, [(m.read_function, m.setpoint_register)], gate)
        return m.decode(values[(m.read_function, m.setpoint_register)])

    def write_setpoint(self, unit: Unit, value: float, gate: Gate = open_gate) -> float:
        """Write, then read the register back (the write's echo is no read-back)."""
        if _modbus_map(unit) is not None:
            try:
                stored = self.write_point(unit, "setPoint", value, gate)
            except InvalidValue as exc:
                raise InvalidSetpoint(value, str(exc)) from exc
            assert isinstance(stored, float)
            return stored
        m = self._unit_map(unit)[0]
        raw = m.encode(value)
        what = f"write of {value} to register {m.setpoint_register}"
        request = rtu.write_request(m.unit_id, m.write_function, m.setpoint_register, raw)
        try:
            self._transact(unit, what, request, gate)
        except ModbusRefused as exc:
            if exc.exception_code == ILLEGAL_DATA_VALUE:
                raise SetpointRejected(str(exc)) from exc
            raise
        self._silent_interval()
        return self.read_setpoint(unit, gate)

    def write_point(
        self, unit: Unit, point: str, value: PointValue, gate: Gate = open_gate
    ) -> PointValue:
        """Write one point with its own write function, then read its register back.
        InvalidValue, before a byte goes out, for a value its register cannot hold."""
        points = _modbus_map(unit)
        if points is None or point not in points.points:
            return super().write_point(unit, point, value, gate)
        spec = points.point(point)
        if spec.write_function is None:
            raise ControllerError(f"{unit.name}: {point} is read only")
        raw = points.encode(point, value)
        shown = str(value).lower() if isinstance(value, bool) else f"{value}"
        what = f"write of {point} {shown} to register {spec.register}"
        unit_id = self._unit_map(unit)[0].unit_id
        request = rtu.write_request(unit_id, spec.write_function, spec.register, raw)
        try:
            self._transact(unit, what, request, gate)
        except ModbusRefused as exc:
            if exc.exception_code == ILLEGAL_DATA_VALUE:
                raise SetpointRejected(
                    f"{exc}: the unit does not take {point} {shown} (out of its limits, not "
                    "a value it has, or against its deadband)"
                ) from exc
            raise
        self._silent_interval()
        return self._read_point(unit, point, gate)

    def _read_point(self, unit: Unit, point: str, gate: Gate) -> PointValue:
        points = _modbus_map(unit)
        assert points is not None
        spec = points.point(point)
        key = (spec.read_function, spec.register)
        registers = self._read_registers(unit, [key], gate, [(*key, 1)])
        try:
            return points.decode(point, registers[key])
        except InvalidValue as exc:
            raise ControllerError(f"{unit.name}: {exc}") from exc


def _state_registers(m: RegisterMap) -> list[tuple[int, int]]:
    """The registers of a unit's state: set point, temperature, output and mode."""
    wanted = [
        (m.read_function, m.setpoint_register),
        (m.status_function, m.temperature_register),
    ]
    if m.output_register is not None:
        wanted.append((m.status_function, m.output_register))
    if m.mode_register is not None:
        wanted.append((m.status_function, m.mode_register))
    return wanted


class RtuReplies:
    """Reply frames off the port, each read by the length its first bytes tell; the line
    quiet for `gap_s` ends a frame cut short."""

    def __init__(self, port: SerialPort, gap_s: float) -> None:
        self.port = port
        self.gap_s = gap_s

    def clear(self) -> None:
        """Nothing kept between frames: each is read whole."""

    def next_reply(self, deadline: float) -> tuple[int | None, bytes] | None:
        reply = self.port.read_exactly(rtu.HEADER_BYTES, deadline, self.gap_s)
        if not reply:
            return None
        length = rtu.reply_length(reply)
        if length is not None and length > len(reply):
            reply += self.port.read_exactly(
                length - len(reply), time.monotonic() + self.gap_s, self.gap_s
            )
        # Only a good CRC makes the first byte the address of the unit that answered.
        if length is None or len(reply) < length or rtu.crc(reply) != 0:
            raise CorruptReply(f"a bad CRC or a reply cut short: {reply.hex(' ')}")
        return reply[0], reply


def _modbus_map(unit: Unit) -> ModbusProfile | None:
    """The unit's points in its registers, when it has a profile (None: the register map's
    set point alone)."""
    return None if unit.profile is None else unit.profile.modbus
