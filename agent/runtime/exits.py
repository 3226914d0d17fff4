"""The agent's exit codes, which the systemd unit relies on (RestartPreventExitStatus=78)."""

EXIT_OK, EXIT_SOFTWARE = 0, 70  # 70, EX_SOFTWARE: the agent's own fault; systemd restarts it
EXIT_CONFIG = 78  # EX_CONFIG: systemd will not restart (RestartPreventExitStatus=78)
