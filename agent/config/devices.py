"""The devices of a line (``AGENT_DEVICES``, or the file ``AGENT_DEVICES_FILE``): their ids,
addresses, profiles and Modbus overrides, how the list is parsed and checked, and the ``Line``
they make up."""

from __future__ import annotations

import json
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from agent.config.line import check_id
from agent.config.running import DeviceMixin
from agent.controller.profile import Profile


class ModbusOverrides(BaseModel):
    """A device whose registers differ from the line's (AGENT_SERIAL__MODBUS_*)."""

    model_config = ConfigDict(extra="forbid")

    setpoint_register: Annotated[int, Field(ge=0, le=65535)] | None = None
    temperature_register: Annotated[int, Field(ge=0, le=65535)] | None = None
    scale: Annotated[float, Field(gt=0)] | None = None
    signed: bool | None = None
    read_function: Annotated[int, Field(ge=3, le=4)] | None = None
    write_function: Literal[6, 16] | None = None


class DeviceSettings(DeviceMixin, BaseModel):
    """One controller on the line: `id@address` in AGENT_DEVICES, or an object in its JSON
    form (or in the file AGENT_DEVICES_FILE) for one that differs from the others."""

    model_config = ConfigDict(extra="forbid")

    id: str
    address: Annotated[int, Field(ge=1, le=247)] | None = None
    min_write_interval_s: Annotated[float, Field(ge=0)] | None = None
    modbus: ModbusOverrides | None = None
    profile: str | None = None
    """The name of its profile (`sim`, or one defined beside the devices); None: the set
    point alone, as before profiles."""
    _profile: Profile | None = PrivateAttr(default=None)

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        return check_id(value)

    @model_validator(mode="after")
    def _profile_or_overrides(self) -> Self:
        if self.profile is not None and self.modbus is not None:
            raise ValueError(
                f"device {self.id}: give a profile or Modbus overrides, not both (its profile "
                "says where its registers are)"
            )
        return self


def parse_devices(value: object) -> object:
    """`id@address,id@address` or a JSON array, as AGENT_DEVICES gives them."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        # Set but empty (`AGENT_DEVICES=` in an env file, a template with no devices): not
        # the same as left out, which makes the line's id a single device of that name.
        raise ValueError(
            "empty: list the line's devices as id@address, e.g. floor3-t01@1,floor3-t02@2 "
            "(or leave it out and set AGENT_DEVICE_ID for a single device)"
        )
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON array of devices: {exc}") from None
    devices = []
    for entry in text.split(","):
        name, at, address = entry.strip().partition("@")
        if not at or not name or not address.strip().isdigit():
            raise ValueError(f"{entry.strip()!r}: expected id@address, e.g. floor3-t01@1")
        devices.append({"id": name, "address": int(address)})
    return devices


def check_devices(devices: list[DeviceSettings]) -> None:
    """Raises ValueError for ids or addresses given twice, or a missing address."""
    seen_ids: dict[str, int] = {}
    seen_addresses: dict[int, str] = {}
    for device in devices:
        if device.id in seen_ids:
            raise ValueError(f"device {device.id} is given twice")
        seen_ids[device.id] = 1
        if device.address is None:
            if len(devices) > 1:
                raise ValueError(f"device {device.id} has no address (id@address)")
            continue
        if device.address in seen_addresses:
            raise ValueError(
                f"address {device.address} is given to both {seen_addresses[device.address]} "
                f"and {device.id}"
            )
        seen_addresses[device.address] = device.id
