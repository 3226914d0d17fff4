"""What the service on an external broker learns from mosquitto's log lines."""

from __future__ import annotations

import pytest

from agent.emulator.external import client_gone_from_log_line


@pytest.mark.parametrize(
    ("line", "gone"),
    [
        ("1795435793: Client agent-a disconnected.", "agent-a"),
        ("1795435793: Client agent-a closed its connection.", "agent-a"),
        ("1795435793: Client agent-a has exceeded timeout, disconnecting.", "agent-a"),
        ("1795435793: Socket error on client agent-a, disconnecting.", "agent-a"),
        ("1795435793: Client agent-a already connected, closing old connection.", "agent-a"),
        # An MQTT 5 session takeover shows only as the new connection.
        (
            "1795435793: New client connected from 127.0.0.1:40193 as agent-a (p5, c1, k30).",
            "agent-a",
        ),
        ("1795435793: New connection from 127.0.0.1:40193 on port 1883.", None),
        ("1795435793: Client agent-a disconnected: session taken over.", "agent-a"),
    ],
)
def test_log_lines(line: str, gone: str | None) -> None:
    assert client_gone_from_log_line(line) == gone
