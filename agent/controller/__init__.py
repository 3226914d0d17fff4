"""The controllers on a line, as the agent talks to them: what the agent sees of one
(`interface`), what a driver offers and must keep (`driver`), the timing of the medium
(`timing`), and the drivers (the ASCII line protocol, Modbus RTU). The simulated line that
`agent sim-device` and `--simulate` run lives in `agent.simulator`, which builds on this
package and is never imported by it. pymodbus is imported only when a Modbus driver is made."""
