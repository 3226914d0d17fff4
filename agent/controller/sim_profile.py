"""The profiles the project ships: `sim`, the simulator's thermostat, in both protocols.

One definition for the simulator (its units serve exactly this) and for the configuration
(a device with `"profile": "sim"`): the line's driver picks the map it speaks.

| point        | kind   | limits / values                 | Modbus (function 3, write 6)   | line |
|--------------|--------|---------------------------------|--------------------------------|------|
| setPoint     | °C     | 5..35, step 0.5                 | register 0, tenths, signed     | SP   |
| temperature  | °C     | read only                       | register 1, tenths, signed     | T    |
| heatSetPoint | °C     | 5..30, step 0.5                 | register 2, tenths, signed     | H    |
| coolSetPoint | °C     | 10..35, step 0.5; 1.0 above H   | register 3, tenths, signed     | C    |
| mode         | choice | off heat cool auto fan          | register 4: 0 1 2 3 4          | M    |
| fan          | choice | auto on low medium high         | register 5: 0 1 2 3 4          | F    |
| occupied     | switch | true / false                    | register 6: 1 / 0              | O    |
| humidity     | %      | read only; in the store by 5.0  | register 7, tenths, unsigned   | RH   |

Registers 0 and 1 are those of the Modbus driver's default register map, so a unit
without a profile reads as before. One read of registers 0..7 fetches every point.
"""

from __future__ import annotations

from agent.controller.interface import DEFAULT_LIMITS, Limits
from agent.controller.line_profile import LinePoint, LineProfile
from agent.controller.modbus_profile import ModbusPoint, ModbusProfile
from agent.controller.points import FAN, MODE
from agent.controller.profile import PointRules, Profile, check

__all__ = ["BUILT_IN", "SIM", "SIM_DEADBAND"]

SIM_DEADBAND = 1.0
"""The least difference the simulator's units keep between cooling and heating set point."""

SIM_MODBUS = ModbusProfile(
    {
        "setPoint": ModbusPoint(0),
        "temperature": ModbusPoint(1, write_function=None),
        "heatSetPoint": ModbusPoint(2),
        "coolSetPoint": ModbusPoint(3),
        "mode": ModbusPoint(4, values={value: raw for raw, value in enumerate(MODE.choices)}),
        "fan": ModbusPoint(5, values={value: raw for raw, value in enumerate(FAN.choices)}),
        "occupied": ModbusPoint(6),
        "humidity": ModbusPoint(7, write_function=None, signed=False),
    }
)

SIM_LINE = LineProfile(
    {
        "setPoint": LinePoint("SP"),
        "temperature": LinePoint("T"),
        "heatSetPoint": LinePoint("H"),
        "coolSetPoint": LinePoint("C"),
        "mode": LinePoint("M"),
        "fan": LinePoint("F"),
        "occupied": LinePoint("O"),
        "humidity": LinePoint("RH"),
    }
)

SIM = Profile(
    "sim",
    {
        "setPoint": PointRules(DEFAULT_LIMITS),
        "temperature": PointRules(),
        "heatSetPoint": PointRules(Limits(5.0, 30.0, 0.5)),
        "coolSetPoint": PointRules(Limits(10.0, 35.0, 0.5)),
        "mode": PointRules(),
        "fan": PointRules(),
        "occupied": PointRules(),
        "humidity": PointRules(store_deadband=5.0),
    },
    deadband=SIM_DEADBAND,
    modbus=SIM_MODBUS,
    line=SIM_LINE,
)
check(SIM)

BUILT_IN: dict[str, Profile] = {SIM.name: SIM}
"""The profiles a device may name without defining them."""
