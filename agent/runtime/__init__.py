"""The agent process: the active/standby role, the periodic jobs, telemetry, systemd, and
`agent --simulate`."""
