"""What one client may cost the embedded broker, and the connection rate bucket. Pure."""

from __future__ import annotations

import resource
from dataclasses import dataclass

from agent.emulator import mqtt_packets as mp

KIB = 1024
MIB = 1024 * KIB


def _default_max_connections() -> int:
    # Every connection is a file descriptor: stay clear of the process's limit.
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1000
    return max(1, min(1000, soft - 64))


@dataclass(frozen=True, slots=True)
class BrokerLimits:
    """The bounds the broker enforces on each client and on all of them together.

    - ``max_packet_size``: the largest packet a client may send (advertised in CONNACK as
      Maximum Packet Size; a bigger one ends the connection with 0x95 Packet Too Large).
    - ``max_queued_bytes``: how much may wait to be sent to one client (messages held for
      its receive window, our write buffer). Past it, QoS 0 messages to that client are
      dropped and a QoS 1 message ends the connection (0x97 Quota Exceeded).
    - ``max_connections``: open sockets at once, connected or not; more are closed at once.
    - ``max_connection_rate``: new sockets per second (a bucket that holds one second's
      worth); more are closed at once.
    - ``connect_timeout_s``: a socket that has not completed CONNECT (and its TLS
      handshake) by then is closed.
    - ``max_connect_size``: the largest CONNECT: until its CONNECT is accepted a client is
      unknown, and may cost no more than that (a bigger one is refused with 0x95 as soon
      as its header arrives).
    - ``max_unauthenticated_bytes``: what all clients not yet connected may hold together
      (their partial CONNECTs); one that would take them past it is refused (0x89).
    - ``packets_per_turn``: packets handled from one client before the others get a turn.
    """

    max_packet_size: int = 16 * MIB
    max_queued_bytes: int = 1 * MIB
    max_connections: int = 1000
    max_connection_rate: float = 200.0
    connect_timeout_s: float = 10.0
    packets_per_turn: int = 16
    max_connect_size: int = 64 * KIB
    max_unauthenticated_bytes: int = 4 * MIB

    def __post_init__(self) -> None:
        if not 64 <= self.max_packet_size <= mp.MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size must be in 64..{mp.MAX_PACKET_SIZE}")
        if self.max_queued_bytes < 1:
            raise ValueError("max_queued_bytes must be at least 1")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if not self.max_connection_rate > 0:
            raise ValueError("max_connection_rate must be > 0")
        if not self.connect_timeout_s > 0:
            raise ValueError("connect_timeout_s must be > 0")
        if self.packets_per_turn < 1:
            raise ValueError("packets_per_turn must be at least 1")
        if not 64 <= self.max_connect_size <= mp.MAX_PACKET_SIZE:
            raise ValueError(f"max_connect_size must be in 64..{mp.MAX_PACKET_SIZE}")
        if self.max_unauthenticated_bytes < self.max_connect_size:
            raise ValueError("max_unauthenticated_bytes must be at least max_connect_size")

    @classmethod
    def default(cls) -> BrokerLimits:
        return cls(max_connections=_default_max_connections())


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """What the state store holds for one client, and the longest key it takes.

    - ``max_key_size``: a SET or KEYNOTIFY on a longer key is refused.
    - ``max_registrations``: KEYNOTIFY registrations one client may hold at once.
    - ``max_registration_bytes``: the bytes of those registrations' key names together.
    """

    max_key_size: int = 64 * KIB
    max_registrations: int = 4096
    max_registration_bytes: int = 1 * MIB

    def __post_init__(self) -> None:
        for name in ("max_key_size", "max_registrations", "max_registration_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


class TokenBucket:
    """``rate`` events per second on average, bursts of at most ``burst``; time injected."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if not rate > 0 or not burst >= 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._updated = now

    def take(self, now: float) -> bool:
        """One event at ``now`` (seconds, monotonic): True if it fits the rate."""
        elapsed = max(0.0, now - self._updated)
        self._updated = now
        self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False
