"""Both drivers on every kind of port the agent supports: a pty (a local serial device), a
serial device server in raw mode (socket://) and one speaking RFC 2217 (rfc2217://), each
served by the simulator with line time emulated."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import serial  # type: ignore[import-untyped]

from agent.controller.driver import Driver, LinkStats, Unit
from agent.controller.line_driver import LineDriver
from agent.controller.modbus_driver import ModbusDriver
from agent.controller.port import SerialPort
from agent.simulator.line import FakeLine

KINDS = ["pty", "socket", "rfc2217"]


@pytest.fixture(params=["line protocol", "modbus"])
async def line(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[FakeLine]:
    fake = FakeLine(2, modbus=request.param == "modbus", emulate_baud=19200, time_constant_s=1e6)
    await fake.start(pty_link=tmp_path / "ttyLINE", tcp_port=0, rfc2217_port=0)
    try:
        yield fake
    finally:
        await fake.stop()


def url_of(line: FakeLine, kind: str) -> str:
    url = {"pty": line.pty_link, "socket": line.tcp_url, "rfc2217": line.rfc2217_url}[kind]
    assert url is not None
    return url


def driver_for(line: FakeLine, url: str) -> Driver:
    # Parity N: Linux ptys may refuse parity bits (the fake does not look at them).
    if line.register_map is not None:
        return ModbusDriver(url, baudrate=19200, parity="N", reply_timeout_s=2.0)
    return LineDriver(url, baudrate=19200, reply_timeout_s=2.0)


@pytest.mark.parametrize("kind", KINDS)
async def test_read_write_and_read_back_on_every_kind_of_port(line: FakeLine, kind: str) -> None:
    driver = driver_for(line, url_of(line, kind))

    def session() -> tuple[float, float, float]:
        driver.open()
        try:
            unit = Unit("t2", 2)
            before = driver.read_state(unit).setpoint
            threading_wait(driver)
            after = driver.write_setpoint(unit, 23.5)
            threading_wait(driver)
            return before, after, driver.read_state(unit).setpoint
        finally:
            driver.close()

    assert await asyncio.to_thread(session) == (20.0, 23.5, 23.5)
    assert line.unit(2).setpoint == 23.5
    assert line.counters.framing_errors == 0


def threading_wait(driver: Driver) -> None:
    """The silent interval the bus keeps between two transactions: what is left of it."""
    threading.Event().wait(max(0.0, driver.silence_left_s()))


@pytest.mark.parametrize("kind", ["socket", "rfc2217"])
async def test_a_serial_device_servers_socket_sends_each_request_at_once(
    line: FakeLine, kind: str
) -> None:
    """No Nagle: a request after one that got no reply must not wait for that one's
    delayed ACK (up to 40 ms, longer than a short reply timeout)."""
    import socket

    from agent.controller.driver import LinkStats
    from agent.controller.port import SerialPort

    port = SerialPort(url_of(line, kind), LinkStats(), baudrate=19200)
    await asyncio.to_thread(port.open)
    try:
        sock = port._port._socket  # type: ignore[union-attr]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        port.close()


@pytest.fixture(params=["pty", "socket"])
def far_end(request: pytest.FixtureRequest) -> Iterator[tuple[str, Callable[[], bytes]]]:
    """A port's URL and a way to read, at its far end, what was written to it."""
    if request.param == "pty":
        master, slave = os.openpty()
        try:
            yield os.ttyname(slave), lambda: os.read(master, 100)
        finally:
            os.close(master)
            os.close(slave)
        return
    with socket.create_server(("127.0.0.1", 0)) as server:
        accepted: list[socket.socket] = []

        def read() -> bytes:
            if not accepted:
                accepted.append(server.accept()[0])
            return accepted[0].recv(100)

        try:
            yield f"socket://127.0.0.1:{server.getsockname()[1]}", read
        finally:
            for connection in accepted:
                connection.close()


def test_a_write_that_went_out_is_no_timeout_however_late_its_thread_ran(
    far_end: tuple[str, Callable[[], bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyserial's write looks at the clock after the bytes went out: a thread kept off the
    CPU past the write timeout meanwhile (a loaded gateway) got 'write timeout' for a write
    that was made, and the agent dropped the line to reopen it ('line lost')."""
    url, read = far_end
    port = SerialPort(url, LinkStats(), baudrate=9600)
    port.open()
    try:
        late = itertools.count(time.monotonic(), 1.0)  # a second later at every look
        monkeypatch.setattr(time, "monotonic", lambda: next(late))
        monkeypatch.setattr(serial.serialutil.Timeout, "TIME", staticmethod(lambda: next(late)))
        port.send(b"@1 GET SP\r\n")
        monkeypatch.undo()
        assert read() == b"@1 GET SP\r\n"
        assert port.is_open
    finally:
        port.close()
