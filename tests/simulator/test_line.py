"""The fake line on the wire: 32 units on one pty (through pyserial) and on TCP, in
addressed mode; per-unit and line-wide faults; one transaction at a time across clients;
line-time emulation; the records; Modbus RTU units through pymodbus's client."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

import pytest
import serial  # type: ignore[import-untyped]

from agent.controller import line_protocol as lp
from agent.simulator.clock import PreciseSleeper
from agent.simulator.core import STRAY_NOISE
from agent.simulator.device import FakeDevice
from agent.simulator.line import DEFAULT_TURNAROUND_S, FakeLine

UNITS = 32


def line(payload: str, checksum: bool = True) -> bytes:
    return lp.encode_line(payload, with_checksum=checksum)


def setpoint_of(address: int) -> float:
    """A set point of its own for each unit, so that a reply shows who answered."""
    return 5.0 + address * 0.5


class Client(Protocol):
    async def send(self, data: bytes) -> None: ...

    async def reply(self) -> bytes: ...

    async def close(self) -> None: ...


class PtyClient:
    """pyserial on the line's pty (the real termios path), off the event loop."""

    def __init__(self, link: str) -> None:
        self.port = serial.serial_for_url(link, baudrate=19200, timeout=3.0, exclusive=True)

    async def send(self, data: bytes) -> None:
        await asyncio.to_thread(self.port.write, data)

    async def reply(self) -> bytes:
        data = bytes(await asyncio.to_thread(self.port.read_until, b"\n"))
        if not data.endswith(b"\n"):
            raise TimeoutError(f"no reply, got {data!r}")
        return data

    async def close(self) -> None:
        self.port.close()


class TcpClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, url: str | None) -> TcpClient:
        assert url is not None
        host, port = url.split("://")[1].rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def reply(self) -> bytes:
        return await asyncio.wait_for(self.reader.readline(), 3.0)

    async def ask(self, data: bytes) -> bytes:
        await self.send(data)
        return await self.reply()

    async def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[FakeLine]:
    fake = FakeLine(UNITS, time_constant_s=1e6)  # temperatures that hold still
    for unit in fake.units:
        assert unit.address is not None
        unit.panel_setpoint(setpoint_of(unit.address))
    await fake.start(pty_link=tmp_path / "ttyBUS", tcp_port=0, panel_port=0)
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture(params=["pty", "tcp"])
async def client(request: pytest.FixtureRequest, bus: FakeLine) -> AsyncIterator[Client]:
    opened: Client
    if request.param == "pty":
        assert bus.pty_link is not None
        opened = PtyClient(bus.pty_link)
    else:
        opened = await TcpClient.connect(bus.tcp_url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def panel(bus: FakeLine) -> AsyncIterator[TcpClient]:
    opened = await TcpClient.connect(bus.panel_url)
    try:
        yield opened
    finally:
        await opened.close()


# --- addressed mode ---------------------------------------------------------------------------


async def test_each_unit_answers_only_its_address(bus: FakeLine, client: Client) -> None:
    # All 32 requests at once: they are served in turn, each by its own unit.
    await client.send(b"".join(line(f"@{n} GET SP") for n in range(1, UNITS + 1)))
    for n in range(1, UNITS + 1):
        assert await client.reply() == line(f"@{n} SP {setpoint_of(n)}")
    # Nobody answers requests without a prefix, to an absent unit, or with a bad prefix:
    # the next reply on the line is that of the last request.
    for text in ("GET SP", "@33 GET SP", "@0 GET SP", "@07 GET SP", "@3GET SP"):
        await client.send(line(text))
    await client.send(line("@32 GET STATE"))
    assert await client.reply() == line(f"@32 STATE SP={setpoint_of(32)} T=18.0 OUT=75 MODE=HEAT")
    records = bus.records[-6:]
    assert [r.address for r in records] == [None, 33, 0, 0, 0, 32]
    assert [r.answered for r in records] == [False] * 5 + [True]
    assert bus.counters.requests == UNITS + 6 and bus.counters.answered == UNITS + 1


async def test_a_write_reaches_its_unit_only(bus: FakeLine, client: Client) -> None:
    await client.send(line("@7 SET SP 23.3"))
    assert await client.reply() == line("@7 OK SP 23.5")
    await client.send(line("@7 GET SP", checksum=False))
    assert await client.reply() == line("@7 SP 23.5", checksum=False)
    assert bus.unit(7).setpoint == 23.5
    assert all(u.setpoint == setpoint_of(u.address or 0) for u in bus.units if u.address != 7)
    assert [(w.value, w.stored) for w in bus.unit(7).writes] == [(23.3, 23.5)]
    assert all(not u.writes for u in bus.units if u.address != 7)
    write = bus.records[0]
    expected_client = "pty" if isinstance(client, PtyClient) else "tcp-1"
    assert (write.client, write.address, write.kind, write.value) == (
        expected_client,
        7,
        "SET SP",
        23.3,
    )
    # A checksum error is the addressed unit's to report.
    await client.send(b"@9 GET SP*00\r\n")
    assert await client.reply() == line("@9 ERR CHECKSUM")


async def test_a_point_to_point_device_ignores_addressed_requests(tmp_path: Path) -> None:
    async with FakeDevice() as device:
        await device.start(tcp_port=0)
        conn = await TcpClient.connect(device.tcp_url)
        try:
            await conn.send(line("@1 GET SP"))
            assert await conn.ask(line("GET SP")) == line("SP 20.0")
            assert [r.address for r in device.requests] == [1, None]
        finally:
            await conn.close()


# --- the panel ----------------------------------------------------------------------------------


async def test_panel_commands_take_the_prefix(bus: FakeLine, panel: TcpClient) -> None:
    assert await panel.ask(b"@3 PANEL SP 19.0\n") == line("@3 OK SP 19.0", False)
    assert await panel.ask(line("@3 GET SP")) == line("@3 SP 19.0")
    assert await panel.ask(b"@3 PANEL SP 40\n") == line("@3 ERR RANGE 5.0 35.0", False)
    assert [c.stored for c in bus.unit(3).panel_changes][-2:] == [19.0, None]
    assert bus.unit(3).writes == []
    assert await panel.ask(b"@3 FAULT FIRE 1\n") == line("@3 ERR SYNTAX", False)
    assert await panel.ask(b"@33 GET SP\n") == line("@33 ERR ADDRESS", False)
    assert await panel.ask(b"GET SP\n") == line("ERR ADDRESS", False)
    assert await panel.ask(b"PANEL SP 21\n") == line("ERR ADDRESS", False)
    assert await panel.ask(b"@0 GET SP\n") == line("ERR SYNTAX", False)
    assert await panel.ask(b"@3 ID\n") == line("@3 ID SIM-TSTAT 1.0.0 SIM0003", False)
    assert bus.records == []  # the panel is not the device line


async def test_per_unit_faults_hit_that_unit_only(
    bus: FakeLine, client: Client, panel: TcpClient
) -> None:
    faults = {
        3: "SILENT 30",
        4: "GARBAGE 1",
        5: "UNPLUG 30",
        6: "STRAY 1",
        7: "BADSUM 1",
        8: "NOSUM 1",
        9: "SLOW 50",
    }
    for address, fault in faults.items():
        assert (
            await panel.ask(f"@{address} FAULT {fault}\n".encode()) == f"@{address} OK\r\n".encode()
        )
    for n in range(1, UNITS + 1):
        await client.send(line(f"@{n} GET SP"))
        if n in (3, 5):
            continue  # no reply: the next one read is the next unit's
        reply = await client.reply()
        if n == 4:
            with pytest.raises(lp.ChecksumError, match="wrong"):
                lp.decode_line(reply, require_checksum=True)
        elif n == 6:
            assert reply == STRAY_NOISE[: STRAY_NOISE.index(b"\n") + 1]
            assert lp.salvage_reply(reply) is None
            reply = await client.reply()
            assert lp.salvage_reply(reply) == lp.Frame(f"@6 SP {setpoint_of(6)}", True)
        elif n == 7:
            with pytest.raises(lp.ChecksumError, match="wrong"):
                lp.salvage_reply(reply)
        elif n == 8:
            with pytest.raises(lp.ChecksumError, match="missing"):
                lp.salvage_reply(reply)
        else:
            assert reply == line(f"@{n} SP {setpoint_of(n)}")
    slow = next(r for r in bus.records if r.address == 9)
    assert slow.busy_s == pytest.approx(0.05)
    assert [r.answered for r in bus.records if r.address in (3, 5)] == [False, False]
    # Counted faults are used up; the unplugged unit is gone until it returns.
    assert bus.unit(5).unplugged and not bus.unit(4).unplugged
    for n in (4, 6, 7, 8):
        await client.send(line(f"@{n} GET SP"))
        assert await client.reply() == line(f"@{n} SP {setpoint_of(n)}")
    # A person changes unit 5's set point while it is off the line; then it returns.
    assert await panel.ask(b"@5 PANEL SP 22\n") == line("@5 OK SP 22.0", False)
    assert await panel.ask(b"@5 FAULT CLEAR\n") == b"@5 OK\r\n"
    await bus.wait_for(lambda: bus.unit(5).plug_count == 1)
    await client.send(line("@5 GET SP"))
    assert await client.reply() == line("@5 SP 22.0")
    assert bus.unit(3).faults.silent(time.monotonic())  # untouched by unit 5's CLEAR


async def test_a_unit_unplugged_for_a_while_returns_by_itself(bus: FakeLine) -> None:
    bus.unit(12).fault("UNPLUG", 0.2)
    assert bus.unit(12).unplugged
    await bus.wait_for(lambda: bus.unit(12).plug_count == 1)
    assert not bus.unit(12).unplugged


async def test_line_wide_faults_hit_every_unit(
    bus: FakeLine, client: Client, panel: TcpClient
) -> None:
    assert await panel.ask(b"FAULT GARBAGE 32\n") == b"OK\r\n"
    for n in range(1, UNITS + 1):
        await client.send(line(f"@{n} GET SP"))
        # The whole reply fails its checksum (salvage_reply may find a shorter frame
        # in it that passes by chance: 1 in 256 for an 8-bit checksum).
        with pytest.raises(lp.ChecksumError):
            lp.decode_line(await client.reply(), require_checksum=True)
    assert bus.faults.garbage == 0
    assert await panel.ask(b"FAULT SILENT 30\n") == b"OK\r\n"
    assert await panel.ask(b"@2 FAULT SILENT 30\n") == b"@2 OK\r\n"
    before = bus.counters.requests
    await client.send(b"".join(line(f"@{n} GET SP") for n in range(1, UNITS + 1)))
    await bus.wait_for(lambda: bus.counters.requests == before + UNITS)
    # CLEAR without a prefix clears the line's faults and every unit's.
    assert await panel.ask(b"FAULT CLEAR\n") == b"OK\r\n"
    await client.send(line("@2 GET SP"))
    assert await client.reply() == line(f"@2 SP {setpoint_of(2)}")


async def test_the_line_unplugged_drops_connections_and_returns(
    bus: FakeLine, panel: TcpClient
) -> None:
    assert bus.pty_link is not None
    conn = await TcpClient.connect(bus.tcp_url)
    try:
        assert await panel.ask(b"FAULT UNPLUG 0.3\n") == b"OK\r\n"
        assert await asyncio.wait_for(conn.reader.read(), 3.0) == b""  # dropped
        with pytest.raises(ConnectionRefusedError):
            await TcpClient.connect(bus.tcp_url)
        assert not await asyncio.to_thread(Path(bus.pty_link).exists)
        await bus.wait_for(lambda: bus.plug_count == 1)
    finally:
        await conn.close()
    again = await TcpClient.connect(bus.tcp_url)
    pty = PtyClient(bus.pty_link)
    try:
        assert await again.ask(line("@32 GET SP")) == line(f"@32 SP {setpoint_of(32)}")
        await pty.send(line("@1 GET SP"))
        assert await pty.reply() == line(f"@1 SP {setpoint_of(1)}")
    finally:
        await again.close()
        await pty.close()


# --- one medium ---------------------------------------------------------------------------------


async def poll(conn: TcpClient, addresses: list[int]) -> None:
    for n in addresses:
        assert await conn.ask(line(f"@{n} GET SP")) == line(f"@{n} SP {setpoint_of(n)}")


async def test_two_clients_get_one_transaction_at_a_time(tmp_path: Path) -> None:
    async with FakeLine(UNITS, emulate_baud=19200, time_constant_s=1e6) as bus:
        for unit in bus.units:
            unit.panel_setpoint(setpoint_of(unit.address or 0))
        await bus.start(tcp_port=0)
        first, second = await TcpClient.connect(bus.tcp_url), await TcpClient.connect(bus.tcp_url)
        try:
            # Each gets the replies of its own units: none lands on the other connection.
            await asyncio.gather(
                poll(first, list(range(1, 17)) * 2), poll(second, list(range(17, 33)) * 2)
            )
        finally:
            await first.close()
            await second.close()
        records = bus.records
    assert len(records) == 64
    assert {r.client for r in records} == {"tcp-1", "tcp-2"}
    for before, after in itertools.pairwise(records):
        # The next transaction starts only when the line is free again.
        assert after.at >= before.at + before.busy_s
    switches = sum(a.client != b.client for a, b in itertools.pairwise(records))
    assert switches >= 16  # they took turns (about every transaction)
    assert bus.counters.collisions > 0
    waited = [r for r in records if r.other_client is not None]
    assert waited and all(r.other_client != r.client for r in waited)
    assert max(r.waited_s for r in waited) > 0


async def test_line_time_emulation(tmp_path: Path) -> None:
    """The time measured is reported, not asserted tightly: it includes the machine."""
    async with FakeLine(UNITS, emulate_baud=9600) as bus:
        await bus.start(pty_link=tmp_path / "ttyBUS")
        assert bus.pty_link is not None
        client = PtyClient(bus.pty_link)
        theoretical = 0.0
        started = time.monotonic()
        try:
            for n in range(1, UNITS + 1):
                request = line(f"@{n} GET STATE")
                await client.send(request)
                reply = await client.reply()
                theoretical += (len(request) + len(reply)) * 10 / 9600 + DEFAULT_TURNAROUND_S
        finally:
            await client.close()
        elapsed = time.monotonic() - started
    assert sum(r.busy_s for r in bus.records) == pytest.approx(theoretical)
    print(f"32 transactions: {elapsed * 1e3:.1f} ms, line time {theoretical * 1e3:.1f} ms")
    assert theoretical <= elapsed < 2 * theoretical + 1.0


# --- records -------------------------------------------------------------------------------------


async def test_records_are_a_bounded_ring_with_counters(tmp_path: Path) -> None:
    async with FakeLine(2, record_limit=5) as bus:
        await bus.start(tcp_port=0)
        conn = await TcpClient.connect(bus.tcp_url)
        try:
            for value in range(12):
                assert await conn.ask(line(f"@1 SET SP {20 + value * 0.5}")) == line(
                    f"@1 OK SP {20 + value * 0.5}"
                )
        finally:
            await conn.close()
        assert [r.seq for r in bus.records] == [8, 9, 10, 11, 12]
        assert [r.seq for r in bus.records_since(10)] == [11, 12]
        assert bus.counters.requests == bus.counters.answered == 12
        assert bus.counters.connections == 1
        assert [w.stored for w in bus.unit(1).writes] == [23.5, 24.0, 24.5, 25.0, 25.5]


async def test_wait_for_wakes_on_requests(bus: FakeLine) -> None:
    conn = await TcpClient.connect(bus.tcp_url)
    try:
        waiting = asyncio.create_task(
            bus.wait_for(lambda: any(r.address == 17 for r in bus.records), 3.0)
        )
        await asyncio.sleep(0)
        assert not waiting.done()
        await conn.send(line("@17 GET SP"))
        await waiting
    finally:
        await conn.close()


def test_line_arguments_are_checked() -> None:
    for kwargs in (
        {"units": 0},
        {"units": 248},
        {"addresses": [1, 1]},
        {"addresses": [0]},
        {"units": 2, "addresses": [1]},
        {"modbus": True},
        {"units": 2, "emulate_baud": 0},
        {"units": 2, "record_limit": 0},
    ):
        with pytest.raises(ValueError):
            FakeLine(**kwargs)  # type: ignore[arg-type]


async def test_the_line_returns_after_an_unplug_shorter_than_a_transaction() -> None:
    async with FakeLine(2) as bus:
        await bus.start(tcp_port=0)
        bus.unit(1).fault("SLOW", 600)
        conn = await TcpClient.connect(bus.tcp_url)
        try:
            await conn.send(line("@1 GET SP"))
            await bus.wait_for(lambda: bus.counters.requests == 1)
            # Unplugged and back while that connection's handler still holds the line.
            bus.fault("UNPLUG", 0.1)
            await bus.wait_for(lambda: bus.plug_count == 1)
        finally:
            await conn.close()
        again = await TcpClient.connect(bus.tcp_url)
        try:
            assert await again.ask(line("@2 GET SP")) == line("@2 SP 20.0")
        finally:
            await again.close()


async def test_the_clock_is_never_early_and_can_restart() -> None:
    sleeper = PreciseSleeper("test-clock")
    late: list[float] = []
    for index in range(20):
        deadline = time.monotonic() + 0.002 + index * 0.0003
        await sleeper.sleep_until(deadline)
        late.append(time.monotonic() - deadline)
    sleeper.close()
    await sleeper.sleep_until(time.monotonic() + 0.001)  # a new thread
    await sleeper.sleep_until(time.monotonic() - 1)  # in the past: at once
    sleeper.close()
    assert min(late) >= 0
    print(f"clock: late by {statistics.median(late) * 1e3:.3f} ms (median)")
