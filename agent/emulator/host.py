"""The broker as its connections see it: ``ConnectionHost``, what a connection
(`connection.py`) needs of the broker (`broker.py`) it belongs to.

The broker is above its connections: it imports `connection.py`, which never imports
`broker.py`; a connection reaches its broker only through this Protocol. It takes the
connection class as a type parameter (a connection holds a ``ConnectionHost[Connection]``),
so this module does not import `connection.py` either.
"""

from __future__ import annotations

import ssl
from typing import Protocol, TypeVar

from agent.emulator import mqtt_packets as mp
from agent.emulator.authz import ClientIdentity
from agent.emulator.disconnects import DisconnectReason
from agent.emulator.limits import BrokerLimits
from agent.message import Message

ConnectionT = TypeVar("ConnectionT", contravariant=True)


class TopicAuthorizer(Protocol):
    def may_connect(self, identity: ClientIdentity) -> bool: ...

    def may_publish(
        self, identity: ClientIdentity, topic: str, response_topic: str | None = None
    ) -> bool: ...

    def may_subscribe(self, identity: ClientIdentity, topic_filter: str) -> bool: ...


class ConnectionHost(Protocol[ConnectionT]):
    """What a connection needs of the broker it belongs to (``Broker`` provides it).

    The settings it reads, and the calls by which it joins and leaves the broker and hands
    it what its client publishes or subscribes to. All are made on the event loop thread.
    """

    @property
    def limits(self) -> BrokerLimits: ...

    @property
    def ssl_context(self) -> ssl.SSLContext | None: ...

    @property
    def receive_maximum(self) -> int: ...

    @property
    def max_keepalive_s(self) -> int: ...

    @property
    def authorizer(self) -> TopicAuthorizer | None: ...

    def admit(self, connection: ConnectionT) -> bool:
        """Whether a new socket may stay (connection count and rate); if so it is counted."""
        ...

    def release(self, connection: ConnectionT) -> None:
        """The socket of ``connection`` is closed: it no longer counts."""
        ...

    def hold_unauthenticated(self, change: int) -> bool:
        """Counts ``change`` more bytes held by clients not yet connected (negative: fewer);
        False, and nothing counted, if that would take them past what they may hold."""
        ...

    def authenticate(self, connect: mp.Connect, certificate_subject: str | None) -> int:
        """The CONNACK reason code for this CONNECT: SUCCESS lets it in."""
        ...

    def principal_username(self, connect: mp.Connect) -> str | None:
        """The user name rules may match for this accepted CONNECT: None if it is not proven."""
        ...

    def register(self, connection: ConnectionT, client_id: str) -> None:
        """``connection`` is now the live session of ``client_id``; a previous one has ended."""
        ...

    def unregister(self, connection: ConnectionT, client_id: str) -> None:
        """``connection`` ended: it no longer receives what is routed to ``client_id``."""
        ...

    def connection_ended(
        self,
        client_id: str,
        reason: DisconnectReason,
        will: Message | None,
        identity: ClientIdentity | None,
    ) -> None:
        """Publishes the will (if any) as ``identity``, then tells the on_disconnect callbacks."""
        ...

    def dispatch(
        self, message: Message, sender: ConnectionT | None, sender_id: str | None = None
    ) -> None:
        """Hands a message to intercepts (client messages only), the retained store, subscribers."""
        ...

    def subscriptions_changed(self) -> None:
        """A connection's subscriptions changed: who receives what must be worked out again."""
        ...

    def send_retained(self, connection: ConnectionT, subscription: mp.Subscription) -> None:
        """Sends ``connection`` the retained messages matching its new ``subscription``."""
        ...
