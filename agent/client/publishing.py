"""One PUBLISH on the session's link, and the wait for its PUBACK.

A QoS 0 message is sent and done. A QoS 1 message holds a permit of the link's in-flight window
until its PUBACK, and fails with ``PublishFailed`` on a reason code >= 0x80. Waiting for a
connection (``wait_connected``), for room in the window and for the PUBACK all count against
one time limit, and the ``SessionTimeout`` says which of them ran out.
"""

from __future__ import annotations

import asyncio
import functools

from agent.client.gmqtt_client import OutgoingMessage
from agent.client.link import wait_until
from agent.client.session_errors import NotConnected, PublishFailed, SessionTimeout
from agent.client.supervisor import Supervisor


async def send_publish(
    supervisor: Supervisor,
    message: OutgoingMessage,
    *,
    topic: str,
    qos: int,
    limit: float,
    wait_connected: bool,
) -> None:
    """Send ``message`` (made by ``outgoing()`` for ``topic``) and, with QoS 1, wait for its
    PUBACK, all within ``limit`` seconds."""
    if qos == 1 and not wait_connected:
        # The common case, connected with room in the window: the PUBACK is the only thing
        # to wait for, and a timer on it is much cheaper than asyncio.timeout() around the
        # whole (measured with tests/bench/bench_client.py). Anything else takes the
        # general path below, which behaves the same.
        loop = asyncio.get_running_loop()
        deadline_at = loop.time() + limit
        link = supervisor.current_link()
        client = link.client
        assert client is not None
        if not link.window.locked():
            # Cannot suspend: there is room in the window.
            ack = await link.send(functools.partial(client.publish_mid, message))
            try:
                code = await wait_until(loop, ack, deadline_at)
            except TimeoutError:
                raise SessionTimeout(f"publish to {topic!r}: no PUBACK within {limit} s") from None
            if code >= 0x80:
                raise PublishFailed(topic, code)
            return

    waiting = f"no connection to {supervisor.where}"
    try:
        async with asyncio.timeout(limit) as deadline:
            while True:
                link = (
                    await supervisor.ready_link() if wait_connected else supervisor.current_link()
                )
                client = link.client
                assert client is not None
                if qos == 0:
                    client.publish_mid(message)
                    return
                waiting = "no room in the in-flight window"
                try:
                    ack = await link.send(functools.partial(client.publish_mid, message))
                except NotConnected:
                    if wait_connected:
                        waiting = f"no connection to {supervisor.where}"
                        continue  # nothing was sent: wait for the next connection
                    raise
                waiting = "no PUBACK"
                code = await ack
                break
    except TimeoutError:
        if not deadline.expired():
            raise
        raise SessionTimeout(f"publish to {topic!r}: {waiting} within {limit} s") from None
    if code >= 0x80:
        raise PublishFailed(topic, code)
