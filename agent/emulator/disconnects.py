"""Why a client's connection to the embedded broker ended (told to ``on_disconnect`` hooks)."""

from __future__ import annotations

import enum


class DisconnectReason(enum.Enum):
    CLEAN = "clean"  # the client sent DISCONNECT
    DROPPED = "dropped"  # the network connection closed without DISCONNECT
    KEEPALIVE_TIMEOUT = "keepalive_timeout"
    TAKEN_OVER = "taken_over"  # another connection used the same client id
    PROTOCOL_ERROR = "protocol_error"  # malformed packet or protocol violation
    SLOW_CONSUMER = "slow_consumer"  # more waited to be sent to it than the broker allows
    KICKED = "kicked"  # Broker.disconnect_client()
    SERVER_SHUTDOWN = "server_shutdown"  # Broker.stop()
