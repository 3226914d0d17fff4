"""The agent process: the active/standby role, the scheduler, telemetry, systemd, and
`agent --simulate`."""
