"""The local controller: the driver interface, the line-protocol (serial) and Modbus RTU
drivers, and the fake device. pymodbus is imported only when a Modbus driver is made."""

from agent.controller.base import SetpointRejected, WriteNotAllowed
from agent.controller.fake_device import FakeDevice, start_fake_device
from agent.controller.interface import (
    DEFAULT_LIMITS,
    Controller,
    ControllerError,
    ControllerFault,
    ControllerState,
    ControllerUnavailable,
    DeviceIdentity,
    InvalidSetpoint,
    Limits,
    Mode,
    validate_setpoint,
)
from agent.controller.modbus_driver import ModbusController, ModbusSupportMissing, RegisterMap
from agent.controller.serial_driver import SerialController

__all__ = [
    "DEFAULT_LIMITS",
    "Controller",
    "ControllerError",
    "ControllerFault",
    "ControllerState",
    "ControllerUnavailable",
    "DeviceIdentity",
    "FakeDevice",
    "InvalidSetpoint",
    "Limits",
    "ModbusController",
    "ModbusSupportMissing",
    "Mode",
    "RegisterMap",
    "SerialController",
    "SetpointRejected",
    "WriteNotAllowed",
    "start_fake_device",
    "validate_setpoint",
]
