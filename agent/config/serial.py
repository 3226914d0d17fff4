"""The serial line (``AGENT_SERIAL__...``): port, framing, timing, and the Modbus options
that apply to every device on it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class SerialSettings(BaseModel):
    """The local controller's line."""

    model_config = ConfigDict(extra="forbid")

    driver: Literal["line", "modbus"] = Field(
        default="line", description="line (ASCII line protocol) or modbus (Modbus RTU)."
    )
    url: str = Field(
        default="",
        description="Device path (/dev/serial/by-id/...), socket://HOST:PORT or "
        "rfc2217://HOST:PORT. Required, except with --simulate.",
    )
    baudrate: Annotated[int, Field(gt=0)] = 9600
    parity: Literal["N", "E", "O"] = "N"
    bytesize: Annotated[int, Field(ge=7, le=8)] = 8
    stopbits: Annotated[int, Field(ge=1, le=2)] = 1
    reply_timeout_s: Annotated[float, Field(gt=0, le=30)] | None = Field(
        default=None,
        description="How long to wait for a controller's reply (default: from the baud "
        "rate and the protocol's turnaround, a few hundred milliseconds).",
    )
    extra_gap_s: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.0,
        description="Quiet time added to the silent interval between transactions, for "
        "slow devices.",
    )
    probe_interval_s: Annotated[float, Field(gt=0)] = Field(
        default=30.0,
        description="How soon a device that stopped answering is tried again (then less "
        "often, up to ten times this); the others are served meanwhile.",
    )
    lock_dir: Path | None = Field(
        default=Path("/run/lock"),
        description="Where a local port is claimed, so that two lines on this gateway never "
        "open the same port (empty: no claim).",
    )
    min_write_interval_s: Annotated[float, Field(ge=0)] = Field(
        default=1.0, description="Least time between two writes (spares the EEPROM)."
    )
    after_absence: Literal["store", "unit"] = Field(
        default="store",
        description="Who wins when a unit comes back from an absence (unplugged, reset, "
        "powered off, replaced) holding other values than those last synced: store (the "
        "store's are written back to it: a replaced unit gets its settings back) or unit "
        "(its values are published). A profile's after_absence overrides it.",
    )
    poll_interval_s: Annotated[float, Field(gt=0)] = Field(
        default=1.0,
        description="How often every controller is read for local changes (one poll cycle).",
    )
    modbus_unit_id: Annotated[int, Field(ge=1, le=247)] = Field(
        default=1, description="The unit id of a single device (AGENT_DEVICES gives each its own)."
    )
    modbus_setpoint_register: Annotated[int, Field(ge=0, le=65535)] = 0
    modbus_temperature_register: Annotated[int, Field(ge=0, le=65535)] = 1
    modbus_scale: Annotated[float, Field(gt=0)] = Field(
        default=10.0, description="Register value = degrees x scale."
    )
    modbus_signed: bool = True
    modbus_read_function: Annotated[int, Field(ge=3, le=4)] = Field(
        default=3, description="3 (holding registers) or 4 (input registers)."
    )
    modbus_write_function: int = Field(
        default=6, description="6 (write single register) or 16 (write multiple)."
    )

    @field_validator("lock_dir", mode="before")
    @classmethod
    def _no_lock_dir(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("modbus_write_function")
    @classmethod
    def _write_function(cls, value: int) -> int:
        if value not in (6, 16):
            raise ValueError("must be 6 or 16")
        return value
