"""A fake line of Modbus RTU units, through pymodbus's own client, on a pty and on TCP
(raw RTU frames, as a serial device server in raw mode passes them)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agent.controller.modbus_map import RegisterMap
from agent.simulator.line import DEFAULT_TURNAROUND_S, FakeLine

pymodbus = pytest.importorskip("pymodbus")
from pymodbus.client import ModbusSerialClient  # noqa: E402
from pymodbus.exceptions import ModbusIOException  # noqa: E402

T = TypeVar("T")
UNITS = 8
ANSWER_WAIT_S = 3.0
"""How long the client waits for a reply that should come: past what a loaded machine delays
the fake line (in this process) by."""
NO_REPLY_WAIT_S = 0.3
"""How long it waits where no reply should come: no load makes a reply out of none."""


def tenths(address: int) -> int:
    """Each unit's own set point, in register units (tenths of a degree)."""
    return 150 + 5 * address


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[FakeLine]:
    fake = FakeLine(UNITS, modbus=True, time_constant_s=1e6)
    for unit in fake.units:
        unit.panel_setpoint(tenths(unit.address or 0) / 10)
    await fake.start(pty_link=tmp_path / "ttyRTU", tcp_port=0, panel_port=0)
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture(params=["pty", "tcp"])
def url(request: pytest.FixtureRequest, bus: FakeLine) -> str:
    found = bus.pty_link if request.param == "pty" else bus.tcp_url
    assert found is not None
    return found


async def with_client(url: str, work: Callable[[Any], T]) -> T:
    """Run `work(client)` with a pymodbus RTU client on `url`, off the event loop."""

    def run() -> T:
        client = ModbusSerialClient(
            url,
            framer=pymodbus.FramerType.RTU,
            baudrate=19200,
            parity="N",  # ptys may refuse parity bits
            timeout=ANSWER_WAIT_S,
            retries=0,
        )
        assert client.connect()
        try:
            return work(client)
        finally:
            client.close()

    return await asyncio.to_thread(run)


def read_setpoint(client: Any, unit: int) -> int:
    response = client.read_holding_registers(0, count=1, device_id=unit)
    assert not response.isError(), response
    return int(response.registers[0])


def no_reply(client: Any, unit: int, wait_s: float = NO_REPLY_WAIT_S) -> bool:
    """Whether `unit` gave no good reply within `wait_s` (the client reads the timeout of its
    parameters at every request)."""
    client.comm_params.timeout_connect = wait_s
    try:
        client.read_holding_registers(0, count=1, device_id=unit)
    except ModbusIOException:
        return True
    finally:
        client.comm_params.timeout_connect = ANSWER_WAIT_S
    return False


async def test_each_unit_answers_at_its_unit_id(bus: FakeLine, url: str) -> None:
    def work(client: Any) -> None:
        for n in range(1, UNITS + 1):
            response = client.read_holding_registers(0, count=2, device_id=n)
            assert response.registers == [tenths(n), 180]
        assert not client.write_register(0, 225, device_id=3).isError()
        assert read_setpoint(client, 3) == 225
        refused = client.write_register(0, 400, device_id=4)  # over the limits
        assert refused.isError() and refused.exception_code == 3
        read_only = client.write_register(1, 100, device_id=4)
        assert read_only.isError() and read_only.exception_code == 2
        assert no_reply(client, UNITS + 1)

    await with_client(url, work)
    assert bus.unit(3).setpoint == 22.5
    assert [(w.value, w.stored) for w in bus.unit(3).writes] == [(22.5, 22.5)]
    assert [(w.value, w.stored) for w in bus.unit(4).writes] == [(40.0, None)]
    assert all(u.setpoint == tenths(u.address or 0) / 10 for u in bus.units if u.address != 3)
    kinds = [(r.address, r.kind, r.value, r.answered) for r in bus.records]
    assert kinds[UNITS : UNITS + 2] == [(3, "WRITE", 22.5, True), (3, "READ HOLDING", None, True)]
    assert kinds[-1] == (UNITS + 1, "READ HOLDING", None, False)


async def test_per_unit_faults_hit_that_unit_only(bus: FakeLine, url: str) -> None:
    bus.unit(2).fault("SILENT", 30)
    bus.unit(4).fault("GARBAGE", 1)  # a reply with a bad CRC: the client drops it
    bus.unit(5).fault("UNPLUG", 30)

    def work(client: Any) -> None:
        for n in range(1, UNITS + 1):
            if n in (2, 4, 5):
                assert no_reply(client, n), n
            else:
                assert read_setpoint(client, n) == tenths(n)
        assert read_setpoint(client, 4) == tenths(4)  # the garbage was used up
        assert no_reply(client, 2) and no_reply(client, 5)

    await with_client(url, work)
    bus.unit(5).panel_setpoint(21.0)  # changed at the unit while it was off the line
    bus.unit(5).fault("CLEAR")
    assert await with_client(url, lambda client: read_setpoint(client, 5)) == 210


async def test_line_wide_faults_hit_every_unit(bus: FakeLine, url: str) -> None:
    bus.fault("GARBAGE", 3)  # the next three replies on the line, whichever unit's

    def work(client: Any) -> None:
        assert [no_reply(client, n) for n in (1, 2, 3)] == [True] * 3
        answered = [not no_reply(client, n, ANSWER_WAIT_S) for n in range(4, UNITS + 1)]
        assert answered == [True] * (UNITS - 3)
        assert all(read_setpoint(client, n) == tenths(n) for n in range(1, UNITS + 1))

    await with_client(url, work)


async def test_line_time_at_11_bits_a_character(tmp_path: Path) -> None:
    async with FakeLine(4, modbus=True, emulate_baud=19200) as bus:
        await bus.start(tcp_port=0)
        assert bus.tcp_url is not None
        await with_client(
            bus.tcp_url, lambda client: client.read_holding_registers(0, count=2, device_id=4)
        )
    (record,) = bus.records
    # Request: 8 bytes. Reply: address, function, byte count, 2 registers, CRC: 9 bytes.
    assert record.busy_s == pytest.approx((8 + 9) * 11 / 19200 + DEFAULT_TURNAROUND_S)


async def test_a_different_register_map(tmp_path: Path) -> None:
    hundredths = RegisterMap(setpoint_register=100, temperature_register=101, scale=100)
    async with FakeLine(addresses=[17, 42], register_map=hundredths) as bus:
        await bus.start(pty_link=tmp_path / "ttyRTU")
        assert bus.pty_link is not None

        def work(client: Any) -> list[int]:
            assert not client.write_register(100, 2150, device_id=42).isError()
            return list(client.read_holding_registers(100, count=2, device_id=42).registers)

        assert await with_client(bus.pty_link, work) == [2150, 1800]
        assert bus.unit(42).setpoint == 21.5 and bus.unit(17).setpoint == 20.0


async def test_the_panel_of_a_modbus_line(bus: FakeLine) -> None:
    assert bus.panel_address is not None
    reader, writer = await asyncio.open_connection(*bus.panel_address)

    async def ask(text: str) -> bytes:
        writer.write(text.encode() + b"\n")
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 3.0)

    try:
        assert await ask("@2 PANEL SP 24.5") == b"@2 OK SP 24.5\r\n"
        assert await ask("@2 GET SP") == b"@2 SP 24.5\r\n"
        assert await ask("@6 FAULT SILENT 30") == b"@6 OK\r\n"
    finally:
        writer.close()
    assert bus.pty_link is not None

    def work(client: Any) -> tuple[int, bool]:
        return read_setpoint(client, 2), no_reply(client, 6)

    assert await with_client(bus.pty_link, work) == (245, True)


# --- a line that behaves like a real one ------------------------------------------------


async def test_a_frame_glued_to_the_last_one_is_a_framing_error_and_a_unit_takes_its_time() -> None:
    """With line time emulated, a unit answers after its turnaround, and a frame that starts
    before the line was quiet for 3.5 character times gets no answer (as on a real line)."""
    from agent.controller import modbus_rtu as rtu

    # 1200 baud: a silent interval of 32 ms, which a loaded machine's stalls do not reach
    # (at 9600 it is 4 ms, and a late writer was no longer glued).
    line = FakeLine(2, modbus=True, emulate_baud=1200, turnaround_s=0.005, time_constant_s=1e6)
    await line.start(tcp_port=0)
    try:
        assert line.tcp_url is not None
        host, port = line.tcp_url.removeprefix("socket://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        request = rtu.read_request(1, rtu.READ_HOLDING, 0, 2)
        char_s = 11 / 1200
        # Two requests in one write: the second comes in while the first is answered, so
        # it starts before the line was quiet after that reply: glued. No answer; counted.
        writer.write(request + request)
        reply = await asyncio.wait_for(reader.readexactly(9), 2)
        assert rtu.parse_reply(request, reply) is not None
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(1), 0.5)
        record = line.records[0]  # the first request's: its reply after its turnaround
        assert record.busy_s == pytest.approx((8 + 9) * char_s + 0.005, rel=0.01)
        assert line.counters.framing_errors == 1
        # After a silent interval (3.5 characters, 32 ms at 1200): answered again.
        await asyncio.sleep(3.5 * char_s * 2)
        writer.write(request)
        assert rtu.parse_reply(request, await asyncio.wait_for(reader.readexactly(9), 2))
        writer.close()
    finally:
        await line.stop()


async def test_a_unit_identifies_itself_to_pymodbus(url: str) -> None:
    """Functions 43/14 (read device identification) and 17 (report server id), as
    pymodbus's client asks and reads them."""

    def ask(client: Any) -> tuple[dict[int, bytes], bytes, int]:
        device = client.read_device_information(read_code=1, object_id=0, device_id=2)
        server = client.report_device_id(device_id=2)
        assert not device.isError() and not server.isError()
        return device.information, server.identifier, server.status

    information, identifier, running = await with_client(url, ask)
    assert information == {0: b"SIM", 1: b"SIM-TSTAT", 2: b"1.0.0 SIM0002"}
    assert identifier == b"SIM-TSTAT 1.0.0 SIM0002"
    assert running
