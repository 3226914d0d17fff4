"""The Modbus RTU driver: a thermostat or HVAC controller on RS-485, through pymodbus.

pymodbus is an optional extra (`pip install 'agent[modbus]'`); it is imported only when
a ModbusDriver is created, so the base install works without it. The register
map and the register codec are plain data and functions.
"""

from __future__ import annotations

import dataclasses
import logging
import termios
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from functools import partial
from typing import TYPE_CHECKING, Any

from agent.controller.driver import Driver, LinkLost, Unit
from agent.controller.interface import (
    DEFAULT_LIMITS,
    ControllerError,
    ControllerState,
    ControllerUnavailable,
    InvalidSetpoint,
    Limits,
    Mode,
    SetpointRejected,
)

if TYPE_CHECKING:
    from pymodbus.client import ModbusSerialClient
    from pymodbus.pdu import ModbusPDU

log = logging.getLogger(__name__)

READ_HOLDING = 3
READ_INPUT = 4
WRITE_SINGLE = 6
WRITE_MULTIPLE = 16
ILLEGAL_DATA_VALUE = 3

_MAX_SPAN = 16
"""Registers up to this far apart are read in one request."""


class ModbusSupportMissing(ImportError):
    """pymodbus is not installed."""


class ModbusRefused(ControllerError):
    """The controller answered with a Modbus exception response."""

    def __init__(self, message: str, exception_code: int | None) -> None:
        super().__init__(message)
        self.exception_code = exception_code


def import_pymodbus() -> Any:
    try:
        import pymodbus.client
    except ImportError as exc:
        raise ModbusSupportMissing(
            "the Modbus RTU driver needs pymodbus: pip install 'agent[modbus]'"
        ) from exc
    return pymodbus


@dataclass(frozen=True, slots=True)
class RegisterMap:
    """Where a controller keeps its values, and how they are encoded.

    A value v is stored as round(v * scale), as a 16-bit two's complement integer if
    `signed`. Limits are either fixed (`limits`) or read from three registers.
    Register numbers are protocol addresses (0-based).
    """

    unit_id: int = 1
    setpoint_register: int = 0
    temperature_register: int = 1
    output_register: int | None = None
    """Output in percent, unscaled."""
    mode_register: int | None = None
    mode_values: tuple[tuple[int, Mode], ...] = (
        (0, Mode.IDLE),
        (1, Mode.HEAT),
        (2, Mode.COOL),
    )
    limits: Limits | None = DEFAULT_LIMITS
    min_register: int | None = None
    max_register: int | None = None
    step_register: int | None = None
    scale: float = 10.0
    signed: bool = True
    read_function: int = READ_HOLDING
    """For the set point and limit registers: 3 (holding) or 4 (input)."""
    status_function: int = READ_HOLDING
    """For temperature, output and mode: 3 (holding) or 4 (input)."""
    write_function: int = WRITE_SINGLE
    """6 (write single register) or 16 (write multiple registers)."""
    _modes: dict[int, Mode] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.unit_id <= 247:
            raise ValueError(f"unit id must be 1..247, not {self.unit_id}")
        for name in (
            "setpoint_register",
            "temperature_register",
            "output_register",
            "mode_register",
            "min_register",
            "max_register",
            "step_register",
        ):
            register = getattr(self, name)
            if register is not None and not 0 <= register <= 0xFFFF:
                raise ValueError(f"{name} must be 0..65535, not {register}")
        limit_registers = (self.min_register, self.max_register, self.step_register)
        if all(r is None for r in limit_registers):
            if self.limits is None:
                raise ValueError("give fixed limits or min, max and step registers")
        elif any(r is None for r in limit_registers) or self.limits is not None:
            raise ValueError("limits: give either fixed limits or all three registers")
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, not {self.scale}")
        for name in ("read_function", "status_function"):
            if getattr(self, name) not in (READ_HOLDING, READ_INPUT):
                raise ValueError(f"{name} must be 3 or 4, not {getattr(self, name)}")
        if self.write_function not in (WRITE_SINGLE, WRITE_MULTIPLE):
            raise ValueError(f"write_function must be 6 or 16, not {self.write_function}")
        object.__setattr__(self, "_modes", dict(self.mode_values))

    def mode_for(self, raw: int) -> Mode:
        try:
            return self._modes[raw]
        except KeyError:
            raise ControllerError(f"unknown mode value {raw}") from None

    def raw_for_mode(self, mode: Mode) -> int:
        return next(raw for raw, known in self.mode_values if known is mode)

    def decode(self, raw: int) -> float:
        """The value of a register."""
        if self.signed and raw >= 0x8000:
            raw -= 0x10000
        return float(Decimal(raw) / _decimal(self.scale))

    def encode(self, value: float) -> int:
        """The register for a value; InvalidSetpoint if 16 bits cannot hold it."""
        scaled = (_decimal(value) * _decimal(self.scale)).to_integral_value(ROUND_HALF_UP)
        low, high = (-0x8000, 0x7FFF) if self.signed else (0, 0xFFFF)
        if not low <= scaled <= high:
            raise InvalidSetpoint(value, f"does not fit a register at scale {self.scale}")
        return int(scaled) & 0xFFFF


def _decimal(value: float) -> Decimal:
    return Decimal(repr(value))


def plan_reads(registers: Iterable[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Group (function, register) pairs into reads (function, first, count), joining
    registers of one function that lie close together."""
    pairs = set(registers)
    reads: list[tuple[int, int, int]] = []
    for function in sorted({f for f, _ in pairs}):
        wanted = sorted(r for f, r in pairs if f == function)
        start = wanted[0]
        for previous, register in zip(wanted, [*wanted[1:], None], strict=True):
            if register is None or register - start >= _MAX_SPAN:
                reads.append((function, start, previous - start + 1))
                if register is not None:
                    start = register
    return reads


_PORT_ERRORS: tuple[type[BaseException], ...] = (OSError, termios.error)

TURNAROUND_S = 0.1
"""How long a Modbus controller may take before it answers (no standard figure; devices
commonly answer within tens of milliseconds)."""

# Read holding registers, request and reply for two registers: the routine poll.
POLL_REQUEST_BYTES = 8
POLL_REPLY_BYTES = 5 + 2 * 2
LONGEST_REPLY_BYTES = 5 + 2 * _MAX_SPAN


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
        pymodbus = import_pymodbus()
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
        self._exceptions = pymodbus.exceptions
        # pymodbus opens the port exclusively itself (exclusive=True, ignored by URLs).
        # No retries: a unit that does not answer costs one reply timeout, not several.
        self._client: ModbusSerialClient = pymodbus.client.ModbusSerialClient(
            url,
            framer=pymodbus.FramerType.RTU,
            baudrate=baudrate,
            bytesize=bytesize,
            parity=parity,
            stopbits=stopbits,
            timeout=self.reply_timeout_s,
            retries=0,
        )

    @property
    def poll_frame(self) -> tuple[int, int]:
        return POLL_REQUEST_BYTES, POLL_REPLY_BYTES

    # --- the port ---------------------------------------------------------------------

    def open(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]
        if not self._client.connect():
            raise LinkLost(f"cannot open {self.url}")
        log.debug("opened %s", self.url)

    def close(self) -> None:
        try:
            self._client.close()  # type: ignore[no-untyped-call]
        except Exception as exc:  # the port may be gone already
            log.debug("closing %s: %s", self.url, exc)

    # --- transactions -----------------------------------------------------------------

    @staticmethod
    def register_map(unit: Unit) -> RegisterMap:
        options = unit.options if isinstance(unit.options, RegisterMap) else RegisterMap()
        if unit.address is not None and unit.address != options.unit_id:
            options = dataclasses.replace(options, unit_id=unit.address)
        return options

    def _execute(self, unit: Unit, what: str, call: Callable[[], ModbusPDU]) -> ModbusPDU:
        if not self._client.connected:
            # pymodbus closed the port after an I/O error; reopening is our job.
            raise LinkLost("port closed after an error")
        errors = self._exceptions
        self.stats.transactions += 1
        try:
            response = call()
        except errors.ConnectionException as exc:
            raise LinkLost(f"{what}: {exc}") from exc
        except errors.ModbusIOException as exc:
            # No reply in time, or one pymodbus dropped for its CRC: either way nothing
            # usable came back within the reply timeout.
            self.stats.timeouts += 1
            self.stats.per_unit_timeouts[unit.name] = (
                self.stats.per_unit_timeouts.get(unit.name, 0) + 1
            )
            raise ControllerUnavailable(
                f"no reply to {what} within {self.reply_timeout_s:g} s"
            ) from exc
        except errors.ModbusException as exc:
            self.stats.corrupt_replies += 1
            raise ControllerError(f"{what}: {exc}") from exc
        except _PORT_ERRORS as exc:
            raise LinkLost(f"{what}: {exc}") from exc
        if response.isError():
            code = getattr(response, "exception_code", None)
            raise ModbusRefused(f"controller refused {what}: Modbus exception {code}", code)
        return response

    def _read_registers(
        self, unit: Unit, wanted: list[tuple[int, int]]
    ) -> dict[tuple[int, int], int]:
        values: dict[tuple[int, int], int] = {}
        unit_id = self.register_map(unit).unit_id
        for function, first, count in plan_reads(wanted):
            read = (
                self._client.read_holding_registers
                if function == READ_HOLDING
                else self._client.read_input_registers
            )
            what = f"read of {count} register(s) at {first} (function {function})"
            response = self._execute(
                unit, what, partial(read, first, count=count, device_id=unit_id)
            )
            registers = list(response.registers)
            if len(registers) < count:
                raise ControllerError(f"{what}: got {len(registers)} registers")
            for offset in range(count):
                values[(function, first + offset)] = registers[offset]
        return values

    def read_state(self, unit: Unit) -> ControllerState:
        m = self.register_map(unit)
        wanted = [
            (m.read_function, m.setpoint_register),
            (m.status_function, m.temperature_register),
        ]
        if m.output_register is not None:
            wanted.append((m.status_function, m.output_register))
        if m.mode_register is not None:
            wanted.append((m.status_function, m.mode_register))
        values = self._read_registers(unit, wanted)
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

    def read_limits(self, unit: Unit) -> Limits:
        m = self.register_map(unit)
        if m.limits is not None:
            return m.limits
        assert m.min_register is not None and m.max_register is not None
        assert m.step_register is not None
        registers = (m.min_register, m.max_register, m.step_register)
        values = self._read_registers(unit, [(m.read_function, r) for r in registers])
        low, high, step = (m.decode(values[(m.read_function, r)]) for r in registers)
        try:
            return Limits(low, high, step)
        except ValueError as exc:
            raise ControllerError(f"nonsense limits: {exc}") from exc

    def read_setpoint(self, unit: Unit) -> float:
        m = self.register_map(unit)
        values = self._read_registers(unit, [(m.read_function, m.setpoint_register)])
        return m.decode(values[(m.read_function, m.setpoint_register)])

    def write_setpoint(self, unit: Unit, value: float) -> float:
        """Write, then read the register back (the write's echo is no read-back)."""
        m = self.register_map(unit)
        raw = m.encode(value)
        what = f"write of {value} to register {m.setpoint_register}"
        try:
            if m.write_function == WRITE_SINGLE:
                self._execute(
                    unit,
                    what,
                    lambda: self._client.write_register(
                        m.setpoint_register, raw, device_id=m.unit_id
                    ),
                )
            else:
                self._execute(
                    unit,
                    what,
                    lambda: self._client.write_registers(
                        m.setpoint_register, [raw], device_id=m.unit_id
                    ),
                )
        except ModbusRefused as exc:
            if exc.exception_code == ILLEGAL_DATA_VALUE:
                raise SetpointRejected(str(exc)) from exc
            raise
        # The line is quiet for the silent interval before the next frame.
        threading.Event().wait(self.timing.silent_s)
        return self.read_setpoint(unit)
