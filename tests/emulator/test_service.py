"""The store service in the embedded broker: every request gets an answer, whatever happens."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent.emulator.store import Outcome
from tests.emulator.conftest import EmulatorThread
from tests.support.paho_client import TIMEOUT, PahoStoreClient

EmulatorFactory = Callable[..., EmulatorThread]


@pytest.fixture
def clients() -> Iterator[Callable[[int, str], PahoStoreClient]]:
    made: list[PahoStoreClient] = []

    def make(port: int, client_id: str) -> PahoStoreClient:
        client = PahoStoreClient("127.0.0.1", port, client_id)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def test_an_exception_in_the_store_is_answered_and_logged(
    emulator_factory: EmulatorFactory,
    clients: Callable[[int, str], PahoStoreClient],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = emulator_factory()
    store = server.emulator.store
    real_handle = store.handle

    def failing(client_id: str, payload: bytes, *args: Any) -> Outcome:
        if b"boom" in payload:
            raise RuntimeError("a bug in the store")
        return real_handle(client_id, payload, *args)

    store.handle = failing  # type: ignore[method-assign]
    client = clients(server.port, "victim")
    with caplog.at_level(logging.ERROR, logger="agent.emulator"):
        response = client.request("GET", "boom")
    assert response.payload == b"-ERR internal error\r\n"
    assert response.prop("__stat") == "200"
    assert response.prop("__ts") is not None
    assert any("victim" in r.getMessage() and r.exc_info for r in caplog.records)
    # And the service goes on.
    assert client.request("SET", "k", "v").payload == b"+OK\r\n"
    assert client.request("GET", "k").payload == b"$1\r\nv\r\n"


def test_an_exception_while_expiring_does_not_stop_expiry(
    emulator_factory: EmulatorFactory,
    clients: Callable[[int, str], PahoStoreClient],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = emulator_factory()
    store = server.emulator.store
    real_expire = store.expire
    failures = [RuntimeError("once")]

    def flaky_expire() -> list[Any]:
        if failures:
            raise failures.pop()
        return real_expire()

    store.expire = flaky_expire  # type: ignore[method-assign]
    client = clients(server.port, "watcher")
    client.request("KEYNOTIFY", "k")
    with caplog.at_level(logging.ERROR, logger="agent.emulator"):
        client.request("SET", "k", "v", "PX", "100")
        set_note = client.notifications.get(timeout=TIMEOUT)
        assert set_note.payload.startswith(b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET")
        delete_note = client.notifications.get(timeout=TIMEOUT)
    assert delete_note.payload == b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"
    assert not failures
    assert any(r.exc_info for r in caplog.records)


def test_a_lease_that_ran_out_is_notified_before_the_reply_to_the_next_request(
    emulator_factory: EmulatorFactory,
    clients: Callable[[int, str], PahoStoreClient],
) -> None:
    """A request that comes after a key's deadline but before the expiry timer ran: the
    key's DELETE reaches a watcher before the reply, as from a store that expires keys on
    time. A standby whose acquisition of an expired lock is granted then knows the lease
    ended (no lock delay to wait out); with the reply first, it learnt of it only after."""
    server = emulator_factory()
    service = server.emulator.service
    standby = clients(server.port, "standby")
    order: list[str] = []
    paho = standby.client
    receive = paho.on_message

    def recorded(client: Any, userdata: Any, message: Any) -> None:
        order.append("notify" if "/command/notify/" in message.topic else "reply")
        receive(client, userdata, message)

    paho.on_message = recorded
    assert standby.request("KEYNOTIFY", "line\\lock").payload == b"+OK\r\n"
    holder = clients(server.port, "holder")
    server.run(_without_expiry_timer(service))
    assert holder.request("SET", "line\\lock", "a", "NX", "PX", "50").payload == b"+OK\r\n"
    standby.notifications.get(timeout=TIMEOUT)  # the SET
    time.sleep(0.1)  # past the deadline; no timer runs the expiry
    order.clear()
    assert standby.request("SET", "line\\lock", "b", "NX", "PX", "3000").payload == b"+OK\r\n"
    deleted = standby.notifications.get(timeout=TIMEOUT)
    assert b"DELETE" in deleted.payload
    assert order[:2] == ["notify", "reply"], order


async def _without_expiry_timer(service: Any) -> None:
    """Keys then expire only when a request comes (as if their timer had not run yet)."""
    service._schedule_expiry = lambda: None
    if service._expiry_timer is not None:
        service._expiry_timer.cancel()
        service._expiry_timer = None
