"""A store whose broker acknowledges every request and whose service never sees one: a
service that has stalled, or answers that a connection about to be cut would have carried."""

from __future__ import annotations

from collections.abc import Callable

from agent.emulator.embedded import EmbeddedStateStore
from agent.message import Message
from agent.protocol import topics


def hold_requests(
    store: EmbeddedStateStore, on_request: Callable[[bytes], None]
) -> Callable[[], None]:
    """From now on, each request is acknowledged and dropped (`on_request(payload)` for each);
    returns the function that lets them through again. Call both on the store's loop."""
    broker = store.broker
    # The emulator has no switch for a deaf service: its broker's intercepts, swapped.
    original = list(broker._intercepts)

    def held(sender: str, message: Message) -> None:
        on_request(message.payload)

    broker._intercepts = [
        (topic, held if topic == topics.INVOKE_TOPIC else handler) for topic, handler in original
    ]
    broker._routes.clear()

    def release() -> None:
        broker._intercepts = original
        broker._routes.clear()

    return release
