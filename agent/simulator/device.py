"""The fake controller: one point-to-point device speaking the line protocol over a thermal
model, on a pty and/or TCP, with a front panel for local changes and injected faults.

It is the single-device case of the fake line (`line.FakeLine`, which also simulates
a whole multi-drop line); the pure parts live in `core`. Beside the contract's panel
commands the fake understands, for tests: `FAULT STRAY <n>` (line noise before the next
n replies), `FAULT BADSUM <n>` and `FAULT NOSUM <n>` (wrong or missing checksum on the
next n replies).
"""

from __future__ import annotations

from pathlib import Path

from agent.controller import line_protocol as lp
from agent.controller.interface import DEFAULT_LIMITS, ControllerState, DeviceIdentity, Limits
from agent.simulator.core import (
    DEFAULT_IDENTITY,
    DEFAULT_RECORD_LIMIT,
    STRAY_NOISE,
    DeviceCore,
    FaultCommand,
    Faults,
    PanelSetpoint,
    WriteRecord,
    corrupt,
    decode_request,
    parse_panel_command,
)
from agent.simulator.line import DEFAULT_TURNAROUND_S, FakeLine, RequestRecord

__all__ = [
    "DEFAULT_IDENTITY",
    "STRAY_NOISE",
    "DeviceCore",
    "FakeDevice",
    "FaultCommand",
    "Faults",
    "PanelSetpoint",
    "RequestRecord",
    "WriteRecord",
    "corrupt",
    "decode_request",
    "parse_panel_command",
    "start_fake_device",
]


class FakeDevice(FakeLine):
    """The fake controller, in-process: a line with one point-to-point device. Start it
    with start(), stop it with stop().

    `writes` lists every SET SP received on the device line with its time, `requests`
    every request, for tests. Faults (fault()) are the whole line's, which for one
    device is the device's.
    """

    def __init__(
        self,
        *,
        setpoint: float = 20.0,
        temperature: float = 18.0,
        limits: Limits = DEFAULT_LIMITS,
        time_constant_s: float = 60.0,
        identity: DeviceIdentity = DEFAULT_IDENTITY,
        host: str = "127.0.0.1",
        emulate_baud: int | None = None,
        record_limit: int = DEFAULT_RECORD_LIMIT,
        turnaround_s: float = DEFAULT_TURNAROUND_S,
    ) -> None:
        super().__init__(
            setpoint=setpoint,
            temperature=temperature,
            limits=limits,
            time_constant_s=time_constant_s,
            identity=identity,
            host=host,
            emulate_baud=emulate_baud,
            record_limit=record_limit,
            turnaround_s=turnaround_s,
        )
        self.device = self.unit(None)

    @property
    def core(self) -> DeviceCore:
        return self.device.core

    @property
    def writes(self) -> list[WriteRecord]:
        return self.device.writes

    @property
    def setpoint(self) -> float:
        return self.device.setpoint

    @property
    def requests(self) -> list[RequestRecord]:
        """The last record_limit requests on the device line, oldest first."""
        return self.records

    def state(self) -> ControllerState:
        return self.device.state()

    def panel_setpoint(self, value: float) -> lp.Reply:
        """A person sets the set point at the device."""
        return self.device.panel_setpoint(value)


async def start_fake_device(
    *,
    pty_link: str | Path | None = None,
    tcp_port: int | None = None,
    panel_port: int | None = None,
    **options: object,
) -> FakeDevice:
    """Create and start a fake device (options as for FakeDevice)."""
    device = FakeDevice(**options)  # type: ignore[arg-type]
    return await device.start(pty_link=pty_link, tcp_port=tcp_port, panel_port=panel_port)
