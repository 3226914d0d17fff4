"""A fake Modbus RTU thermostat: pymodbus's own server on a pty, over the thermal model.

pymodbus opens a serial port by path, and so does the driver; a pty has one path, so
two ptys are bridged here, which is also where line faults are injected:

    driver -> link -> pty C == bridge == pty S <- pymodbus ModbusSerialServer

Needs pymodbus (the `modbus` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, cast

from agent.controller.fake_device import WriteRecord
from agent.controller.interface import DEFAULT_LIMITS, ControllerState, Limits, round_to_step
from agent.controller.modbus_driver import RegisterMap, import_pymodbus
from agent.controller.ptys import RawPty, point_link, remove_link
from agent.controller.thermal_model import ThermalModel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RegisterAccess:
    """One request that reached the fake's registers."""

    at: float
    function_code: int
    address: int
    count: int
    written: tuple[int, ...] | None


class FakeModbusThermostat:
    """In-process fake; `writes` lists the set point writes it received."""

    def __init__(
        self,
        register_map: RegisterMap | None = None,
        *,
        setpoint: float = 20.0,
        temperature: float = 18.0,
        limits: Limits = DEFAULT_LIMITS,
        time_constant_s: float = 60.0,
        baudrate: int = 19200,
        parity: str = "N",
    ) -> None:
        # Parity "N": Linux ptys may refuse PARENB (tcsetattr EINVAL), so a fake on a
        # pty cannot use the Modbus default 8E1; give the driver parity="N" to match.
        self._pymodbus = import_pymodbus()
        self.map = register_map or RegisterMap()
        self.limits = limits
        self.baudrate = baudrate
        self.parity = parity
        self.model = ThermalModel(
            setpoint=round_to_step(setpoint, limits),
            temperature=temperature,
            now=time.monotonic(),
            time_constant_s=time_constant_s,
        )
        self.writes: list[WriteRecord] = []
        self.accesses: list[RegisterAccess] = []
        self.silent_until: float | None = None
        self.garbage = 0
        self.plug_count = 0
        self._link: Path | None = None
        self._server_pty: RawPty | None = None
        self._client_pty: RawPty | None = None
        self._server: Any = None
        self._replug: asyncio.TimerHandle | None = None
        self._changed = asyncio.Event()

    # --- registers --------------------------------------------------------------------

    def _initial_registers(self) -> dict[int, int]:
        m = self.map
        registers = {m.setpoint_register: 0, m.temperature_register: 0}
        if m.output_register is not None:
            registers[m.output_register] = 0
        if m.mode_register is not None:
            registers[m.mode_register] = 0
        if m.min_register is not None:
            assert m.max_register is not None and m.step_register is not None
            registers[m.min_register] = m.encode(self.limits.min)
            registers[m.max_register] = m.encode(self.limits.max)
            registers[m.step_register] = m.encode(self.limits.step)
        return registers

    def _refresh(self, registers: list[int], start: int, now: float) -> None:
        """Put the model's current values into the register block."""
        m = self.map
        state = self.model.state(now)
        values = {
            m.setpoint_register: m.encode(state.setpoint),
            m.temperature_register: m.encode(round(state.temperature, 1)),
        }
        if m.output_register is not None and state.output is not None:
            values[m.output_register] = state.output
        if m.mode_register is not None and state.mode is not None:
            values[m.mode_register] = m.raw_for_mode(state.mode)
        for register, raw in values.items():
            registers[register - start] = raw

    async def _action(
        self,
        function_code: int,
        start_address: int,
        address: int,
        count: int,
        registers: list[int],
        set_values: list[int] | list[bool] | None,
    ) -> Any:
        codes = self._pymodbus.constants.ExcCodes
        now = time.monotonic()
        written = None if set_values is None else tuple(int(v) for v in set_values)
        self.accesses.append(RegisterAccess(now, function_code, address, count, written))
        self._refresh(registers, start_address, now)
        if set_values is None:
            self._notify()
            return None
        if address != self.map.setpoint_register or count != 1:
            return codes.ILLEGAL_ADDRESS
        value = self.map.decode(int(set_values[0]))
        stored: float | None = None
        if self.limits.min <= value <= self.limits.max:
            stored = round_to_step(value, self.limits)
            self.model.set_setpoint(stored, now)
            # Changing the list in place changes what pymodbus stores.
            cast(list[int], set_values)[0] = self.map.encode(stored)
        self.writes.append(WriteRecord(at=now, value=value, stored=stored, channel="modbus"))
        self._notify()
        return None if stored is not None else codes.ILLEGAL_VALUE

    # --- lifecycle --------------------------------------------------------------------

    async def start(self, link: str | Path) -> Self:
        pymodbus = self._pymodbus
        from pymodbus.server import ModbusSerialServer
        from pymodbus.simulator import DataType, SimData, SimDevice

        self._changed = asyncio.Event()
        self._server_pty = RawPty()
        self._attach_client(link)
        loop = asyncio.get_running_loop()
        loop.add_reader(self._server_pty.master, self._from_server)
        device = SimDevice(
            id=self.map.unit_id,
            simdata=[
                SimData(
                    address,
                    values=raw,
                    datatype=DataType.REGISTERS,
                    readonly=address != self.map.setpoint_register,
                )
                for address, raw in sorted(self._initial_registers().items())
            ],
            action=self._action,
        )
        self._server = ModbusSerialServer(
            device,
            framer=pymodbus.FramerType.RTU,
            port=self._server_pty.slave_name,
            baudrate=self.baudrate,
            parity=self.parity,
        )
        await self._server.serve_forever(background=True)
        return self

    def _attach_client(self, link: str | Path) -> None:
        self._link = Path(link).absolute()
        self._client_pty = RawPty()
        asyncio.get_running_loop().add_reader(self._client_pty.master, self._from_client)
        point_link(self._link, self._client_pty.slave_name)

    def _detach_client(self) -> None:
        pty, self._client_pty = self._client_pty, None
        if pty is None:
            return
        asyncio.get_running_loop().remove_reader(pty.master)
        if self._link is not None:
            remove_link(self._link, pty.slave_name)
        pty.close()

    async def stop(self) -> None:
        if self._replug is not None:
            self._replug.cancel()
            self._replug = None
        self._detach_client()
        if self._server is not None:
            await self._server.shutdown()
            self._server = None
        if self._server_pty is not None:
            asyncio.get_running_loop().remove_reader(self._server_pty.master)
            self._server_pty.close()
            self._server_pty = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def link(self) -> str | None:
        return None if self._link is None else str(self._link)

    # --- the bridge, where faults happen ----------------------------------------------

    def _from_client(self) -> None:
        assert self._client_pty is not None
        data = _read(self._client_pty.master)
        silent = self.silent_until is not None and time.monotonic() < self.silent_until
        if data and not silent and self._server_pty is not None:
            _write(self._server_pty.master, data)

    def _from_server(self) -> None:
        assert self._server_pty is not None
        data = _read(self._server_pty.master)
        if not data or self._client_pty is None:
            return
        if self.garbage > 0:
            # A bit error: the CRC no longer matches and the driver must drop the frame.
            self.garbage -= 1
            data = bytes([data[0] ^ 0x10]) + data[1:]
        _write(self._client_pty.master, data)

    # --- tests ------------------------------------------------------------------------

    @property
    def setpoint(self) -> float:
        return self.model.setpoint

    def state(self) -> ControllerState:
        return self.model.state(time.monotonic())

    def panel_setpoint(self, value: float) -> None:
        """A local change at the device."""
        self.model.set_setpoint(round_to_step(value, self.limits), time.monotonic())
        self._notify()

    def fault(self, kind: str, amount: float = 0.0) -> None:
        """UNPLUG <s>, SILENT <s>, GARBAGE <count> (replies with a bad CRC), CLEAR."""
        kind = kind.upper()
        if kind == "UNPLUG":
            self._detach_client()
            loop = asyncio.get_running_loop()
            self._replug = loop.call_later(amount, self._plug)
        elif kind == "SILENT":
            self.silent_until = time.monotonic() + amount
        elif kind == "GARBAGE":
            self.garbage = int(amount)
        elif kind == "CLEAR":
            self.silent_until = None
            self.garbage = 0
            if self._replug is not None:
                self._replug.cancel()
                self._plug()
        else:
            raise ValueError(f"unknown fault {kind!r}")
        self._notify()

    def _plug(self) -> None:
        self._replug = None
        if self._client_pty is None and self._link is not None and self._server is not None:
            self._attach_client(self._link)
            self.plug_count += 1
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await self._changed.wait()


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except (BlockingIOError, OSError):
        return b""


def _write(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, data)
