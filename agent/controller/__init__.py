"""The controllers on a line: what the agent sees of one (`interface`), what a driver offers
(`driver`), the drivers (the ASCII line protocol, Modbus RTU) and the fake devices for tests
and `--simulate`. pymodbus is imported only when a Modbus driver is made."""
