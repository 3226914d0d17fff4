"""Keeps a controller's set point in sync with the Azure IoT Operations state store."""

__version__ = "0.1.0"
