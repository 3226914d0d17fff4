"""The session's subscriptions: what every connection subscribes to, and where messages go.

One ``Subscription`` per topic filter, at the highest QoS any of its handlers asked for, with a
subscription identifier of its own (MQTT 5) that the broker tags each message with. A message
that carries identifiers goes to the handlers of the subscriptions they name; one without them
(a broker that does not support them) goes to those of every filter its topic matches.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import ValuesView

from agent.client.handlers import HandlerEntry, Subscription
from agent.client.link import Link
from agent.message import Message
from agent.protocol.mqtt_topics import topic_matches

# Every message without subscription identifiers is matched against every subscription; the
# same few (filter, topic) pairs come back all the time (the response topic above all).
_cached_topic_matches = functools.lru_cache(maxsize=1024)(topic_matches)


class Subscriptions:
    """The subscriptions by topic filter, each made again on every connection."""

    def __init__(self) -> None:
        self._subscriptions: dict[str, Subscription] = {}
        self._identifiers = itertools.count(1)

    def get(self, topic_filter: str) -> Subscription | None:
        return self._subscriptions.get(topic_filter)

    def values(self) -> ValuesView[Subscription]:
        return self._subscriptions.values()

    def add(self, topic_filter: str, qos: int) -> Subscription:
        """A new subscription to ``topic_filter``, with the next subscription identifier."""
        subscription = self._subscriptions[topic_filter] = Subscription(
            topic_filter, qos, next(self._identifiers)
        )
        return subscription

    def forget(
        self, subscription: Subscription, entry: HandlerEntry, qos: int | None = None
    ) -> None:
        """Drop ``entry``, restoring the subscription's QoS to ``qos`` if given; drop the
        subscription with its last handler."""
        if qos is not None:
            subscription.qos = qos
        if entry in subscription.handlers:
            subscription.handlers.remove(entry)
        entry.close()
        if not subscription.handlers and (
            self._subscriptions.get(subscription.topic_filter) is subscription
        ):
            del self._subscriptions[subscription.topic_filter]

    def deliver(self, message: Message, identifiers: list[int]) -> None:
        """Hand ``message`` to the handlers of every subscription it was sent for."""
        for subscription in list(self._subscriptions.values()):
            if (
                subscription.identifier in identifiers
                if identifiers
                else _cached_topic_matches(subscription.topic_filter, message.topic)
            ):
                for entry in list(subscription.handlers):
                    entry.deliver(message)


def send_subscribe(link: Link, subscription: Subscription) -> int:
    """Send the SUBSCRIBE for ``subscription`` on ``link``; return its packet id."""
    assert link.client is not None
    identifier = subscription.identifier if link.subscription_identifiers else None
    return link.client.subscribe_mid(subscription.topic_filter, subscription.qos, identifier)
