"""The line as configured: its driver, its units, and what is worth warning about."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from agent.config import MAX_UNIT_LOADS
from agent.controller.driver import Driver, Unit
from agent.controller.line_driver import LineDriver
from agent.controller.modbus_driver import ModbusDriver
from agent.controller.modbus_map import RegisterMap
from agent.controller.profile import SET_POINT_ONLY, Profile
from agent.controller.timing import cycle_s

if TYPE_CHECKING:
    from agent.config import AgentSettings, DeviceSettings

log = logging.getLogger("agent")


def make_driver(settings: AgentSettings) -> Driver:
    serial = settings.serial
    common: dict[str, Any] = {
        "baudrate": serial.baudrate,
        "parity": serial.parity,
        "bytesize": serial.bytesize,
        "stopbits": serial.stopbits,
        "reply_timeout_s": serial.reply_timeout_s,
        "extra_gap_s": serial.extra_gap_s,
    }
    if serial.driver == "modbus":
        return ModbusDriver(serial.url, **common)
    return LineDriver(serial.url, **common)


def make_units(settings: AgentSettings) -> list[Unit]:
    return [_unit(settings, device) for device in settings.line.devices]


def _unit(settings: AgentSettings, device: DeviceSettings) -> Unit:
    serial = settings.serial
    profile = device.resolved_profile
    if serial.driver != "modbus":
        return Unit(device.id, device.address, profile=profile)
    override = device.modbus
    chosen: dict[str, Any] = {
        "setpoint_register": serial.modbus_setpoint_register,
        "temperature_register": serial.modbus_temperature_register,
        "scale": serial.modbus_scale,
        "signed": serial.modbus_signed,
        "read_function": serial.modbus_read_function,
        "write_function": serial.modbus_write_function,
    }
    if override is not None:
        chosen.update(override.model_dump(exclude_none=True))
    unit_id = device.address if device.address is not None else serial.modbus_unit_id
    register_map = RegisterMap(unit_id=unit_id, status_function=chosen["read_function"], **chosen)
    return Unit(device.id, unit_id, register_map, profile=profile)


def device_profile(settings: AgentSettings, device: DeviceSettings) -> Profile:
    """The device's profile: its points, their limits and how they are kept (a device
    without one has the set point alone)."""
    found = device.resolved_profile
    return found if found is not None else SET_POINT_ONLY


def write_intervals(settings: AgentSettings) -> dict[str, float]:
    default = settings.serial.min_write_interval_s
    return {
        device.id: default if device.min_write_interval_s is None else device.min_write_interval_s
        for device in settings.line.devices
    }


def line_cycle_s(driver: Driver, units: list[Unit]) -> float:
    """A poll cycle's line time: every exchange that reads each unit once (a unit with a
    profile may take a longer reply, or more than one read), at the line's timing."""
    return sum(
        cycle_s(driver.timing, 1, request, reply)
        for unit in units
        for request, reply in driver.poll_frames(unit)
    )


def warn_about(settings: AgentSettings, driver: Driver) -> float:
    """Logs what makes no sense on a real line; returns the cycle's line time."""
    devices = len(settings.line.devices)
    cycle = line_cycle_s(driver, make_units(settings))
    poll = settings.serial.poll_interval_s
    log.info(
        "line %s: %d device(s) at %d baud, a poll cycle takes %.0f ms of line time "
        "(poll interval %g s, reply timeout %.0f ms)",
        settings.line.id,
        devices,
        driver.timing.baudrate,
        cycle * 1000,
        poll,
        driver.reply_timeout_s * 1000,
    )
    if cycle > poll:
        log.warning(
            "line %s: a poll cycle (%.2f s of line time) is longer than the poll interval "
            "(AGENT_SERIAL__POLL_INTERVAL_S=%g): devices are read less often than asked",
            settings.line.id,
            cycle,
            poll,
        )
    if devices > MAX_UNIT_LOADS:
        log.warning(
            "line %s: %d devices; an RS-485 segment drives %d unit loads (use repeaters or "
            "1/4 and 1/8 unit load transceivers)",
            settings.line.id,
            devices,
            MAX_UNIT_LOADS,
        )
    return cycle
