"""The simulator: a serial line of thermostats in one process, for `agent sim-device`,
`agent --simulate` and the tests. Units at addresses 1..N speaking the ASCII line protocol
or Modbus RTU, each with a thermal model and a front panel, on a pty and/or a TCP serial
server, with faults on demand and a record of every transaction for checkers.

It builds on the protocol code of `agent.controller` (the line protocol's codec, the Modbus
register map) and is never imported by the agent's own code, except `--simulate`, which
runs it beside the agent.

- `core`: one unit's behaviour, pure (requests, panel, faults); `rtu`: its Modbus registers;
  `thermal_model`: the room it heats.
- `line`: units on one medium, one transaction at a time; `wires`: what the bytes mean;
  `endpoints`: the pty, the TCP server and the panel; `ptys`, `clock`: the plumbing.
- `device`, `modbus`: a single unit on a line of its own; `cli`: `agent sim-device`.
"""
