"""The controllers on a line, as the agent talks to them: what the agent sees of one
(`interface`), what a driver offers and must keep (`driver`), the timing of the medium
(`timing`), the port (`port`), and the drivers: the ASCII line protocol (`line_protocol`,
`line_driver`) and Modbus RTU (`modbus_rtu`, `modbus_map`, `modbus_driver`); a thermostat's
points (`points`), and the profiles that say which a model has and how each protocol keeps
them (`profile`, `modbus_profile`, `line_profile`; the built-in `sim`: `sim_profile`). The simulated
line that `agent sim-device` and `--simulate` run lives in `agent.simulator`, which builds
on this package and is never imported by it."""
