"""A fake Modbus RTU thermostat on a pty: a fake line with one Modbus unit.

The unit serves the registers of a RegisterMap over its thermal model (`rtu`), at the
map's unit id, on a pty at a stable path (a symlink), as the driver opens a real port:

    driver -> link -> pty == FakeLine (Modbus RTU) == unit <map.unit_id>

For many units, TCP (`socket://`) and line-time emulation use FakeLine itself
(`FakeLine(32, modbus=True)`, `agent sim-device --units 32 --modbus`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from agent.controller.interface import DEFAULT_LIMITS, ControllerState, Limits
from agent.controller.modbus_map import RegisterMap
from agent.simulator.core import WriteRecord
from agent.simulator.line import FakeLine, Unit
from agent.simulator.rtu import RegisterAccess

__all__ = ["FakeModbusThermostat", "RegisterAccess"]


class FakeModbusThermostat:
    """In-process fake; `writes` lists the set point writes it received, `accesses` every
    request that reached its registers."""

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
        emulate_baud: bool = False,
    ) -> None:
        """`baudrate` and `parity` describe the line (a pty has neither: the driver must
        use parity "N", as Linux ptys may refuse PARENB); with `emulate_baud` replies take
        the line time at `baudrate`."""
        self.map = register_map or RegisterMap()
        self.limits = limits
        self.baudrate = baudrate
        self.parity = parity
        self.line = FakeLine(
            addresses=[self.map.unit_id],
            register_map=self.map,
            setpoint=setpoint,
            temperature=temperature,
            limits=limits,
            time_constant_s=time_constant_s,
            emulate_baud=baudrate if emulate_baud else None,
        )
        self.unit: Unit = self.line.unit(self.map.unit_id)

    # --- lifecycle --------------------------------------------------------------------

    async def start(self, link: str | Path) -> Self:
        await self.line.start(pty_link=link)
        return self

    async def stop(self) -> None:
        await self.line.stop()

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
        return self.line.pty_link

    # --- tests ------------------------------------------------------------------------

    @property
    def writes(self) -> list[WriteRecord]:
        return self.unit.writes

    @property
    def accesses(self) -> list[RegisterAccess]:
        assert self.unit.registers is not None
        return self.unit.registers.accesses

    @property
    def setpoint(self) -> float:
        return self.unit.setpoint

    @property
    def plug_count(self) -> int:
        return self.line.plug_count

    @property
    def silent_until(self) -> float | None:
        return self.line.faults.silent_until

    @property
    def garbage(self) -> int:
        return self.line.faults.garbage

    def state(self) -> ControllerState:
        return self.unit.core.model.state(time.monotonic())

    def panel_setpoint(self, value: float) -> None:
        """A local change at the device."""
        self.unit.panel_setpoint(value)

    def fault(self, kind: str, amount: float = 0.0) -> None:
        """UNPLUG <s> (the link vanishes), SILENT <s>, GARBAGE <count> (replies with a bad
        CRC), SLOW <ms>, CLEAR."""
        self.line.fault(kind, amount)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
        await self.line.wait_for(predicate, timeout_s)
