"""An MQTT 5 application message with the properties this project uses: what the embedded
broker routes and what the client session delivers."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Message:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    response_topic: str | None = None
    correlation_data: bytes | None = None
    content_type: str | None = None
    message_expiry_interval: int | None = None
    payload_format_indicator: int | None = None
    # In wire order, duplicates kept (MQTT 5 allows a name to appear more than once).
    user_properties: list[tuple[str, str]] = field(default_factory=list)

    def user_property(self, name: str) -> str | None:
        """The first value of user property `name`, or None."""
        return next((value for key, value in self.user_properties if key == name), None)
