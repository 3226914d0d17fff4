"""The fake device: its pure core, and its wire behaviour over a pty, TCP and the panel."""

from __future__ import annotations

import asyncio
import errno
import termios
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import serial  # type: ignore[import-untyped]

from agent.controller import line_protocol as lp
from agent.controller.interface import Limits
from agent.simulator.device import (
    STRAY_NOISE,
    DeviceCore,
    FakeDevice,
    FaultCommand,
    Faults,
    PanelSetpoint,
    corrupt,
    parse_panel_command,
)


def line(payload: str, checksum: bool = True) -> bytes:
    return lp.encode_line(payload, with_checksum=checksum)


# --- the pure core ---------------------------------------------------------------------


@pytest.fixture
def core() -> DeviceCore:
    return DeviceCore(now=0.0, setpoint=20.0, temperature=18.0, time_constant_s=60.0)


@pytest.mark.parametrize(
    ("request_", "reply"),
    [
        ("ID", "ID SIM-TSTAT 1.0.0 SIM0001"),
        ("GET SP", "SP 20.0"),
        ("GET T", "T 18.0"),
        ("GET STATE", "STATE SP=20.0 T=18.0 OUT=50 MODE=HEAT"),
        ("GET LIMITS", "LIMITS 5.0 35.0 0.5"),
        ("SET SP 21.3", "OK SP 21.5"),
        ("SET SP 35.5", "ERR RANGE 5.0 35.0"),
        ("SET SP 4", "ERR RANGE 5.0 35.0"),
        ("SET SP warm", "ERR SYNTAX"),
        ("GET", "ERR SYNTAX"),
        ("GET WIND", "ERR UNKNOWN"),
        ("HELLO", "ERR UNKNOWN"),
    ],
)
@pytest.mark.parametrize("checksum", [True, False])
def test_every_command(core: DeviceCore, request_: str, reply: str, checksum: bool) -> None:
    assert core.respond(line(request_, checksum), now=0.0) == line(reply, checksum)


def test_wrong_checksum_is_answered_err_checksum(core: DeviceCore) -> None:
    assert core.respond(b"GET SP*00\r\n", now=0.0) == line("ERR CHECKSUM")
    assert core.respond(b"SET SP 30*00\n", now=0.0) == line("ERR CHECKSUM")
    assert core.writes == []


def test_bare_lf_and_blank_lines(core: DeviceCore) -> None:
    assert core.respond(b"GET SP\n", now=0.0) == line("SP 20.0", False)
    assert core.respond(b"\r\n", now=0.0) is None
    assert core.respond(b"   ", now=0.0) is None


def test_malformed_lines_are_syntax_errors(core: DeviceCore) -> None:
    assert core.respond(b"GET\x00SP\r\n", now=0.0) == line("ERR SYNTAX", False)
    assert core.respond(b"X" * 79 + b"\r\n", now=0.0) == line("ERR SYNTAX", False)


def test_writes_are_recorded_with_their_time(core: DeviceCore) -> None:
    core.respond(line("SET SP 22"), now=5.0, channel="pty")
    core.respond(line("SET SP 99"), now=6.0, channel="pty")
    assert [(w.at, w.value, w.stored, w.channel) for w in core.writes] == [
        (5.0, 22.0, 22.0, "pty"),
        (6.0, 99.0, None, "pty"),
    ]


def test_temperature_follows_the_setpoint(core: DeviceCore) -> None:
    core.respond(line("SET SP 30"), now=0.0)
    assert core.state(60.0).temperature == pytest.approx(30 - 12 / 2.718281828, abs=0.06)
    assert core.state(6000.0).temperature == 30.0
    assert core.respond(line("GET STATE"), now=6000.0) == line(
        "STATE SP=30.0 T=30.0 OUT=0 MODE=IDLE"
    )


def test_other_limits() -> None:
    core = DeviceCore(now=0.0, limits=Limits(10.0, 30.0, 1.0), setpoint=20.4)
    assert core.respond(line("GET LIMITS"), now=0.0) == line("LIMITS 10.0 30.0 1.0")
    assert core.respond(line("GET SP"), now=0.0) == line("SP 20.0")
    assert core.respond(line("SET SP 21.5"), now=0.0) == line("OK SP 22.0")


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("PANEL SP 22.5", PanelSetpoint(22.5)),
        ("FAULT UNPLUG 2", FaultCommand("UNPLUG", 2)),
        ("fault silent 0.5", FaultCommand("SILENT", 0.5)),
        ("FAULT GARBAGE 3", FaultCommand("GARBAGE", 3)),
        ("FAULT SLOW 300", FaultCommand("SLOW", 300)),
        ("FAULT STRAY 1", FaultCommand("STRAY", 1)),
        ("FAULT BADSUM 1", FaultCommand("BADSUM", 1)),
        ("FAULT NOSUM 1", FaultCommand("NOSUM", 1)),
        ("FAULT CLEAR", FaultCommand("CLEAR")),
        ("GET SP", None),
    ],
)
def test_panel_commands_parse(text: str, command: object) -> None:
    assert parse_panel_command(text) == command


@pytest.mark.parametrize(
    "text",
    [
        "PANEL",
        "PANEL SP",
        "PANEL X 3",
        "PANEL M",
        "PANEL SP hot",
        "FAULT",
        "FAULT FIRE 1",
        "FAULT GARBAGE 1.5",
        "FAULT SLOW -1",
        "FAULT UNPLUG",
    ],
)
def test_bad_panel_commands_are_syntax_errors(text: str) -> None:
    with pytest.raises(lp.RequestError):
        parse_panel_command(text)


def test_corrupt_breaks_the_checksum_but_keeps_a_line() -> None:
    for payload in ["SP 20.0", "OK SP 21.5", "STATE SP=20.0 T=18.0 OUT=50 MODE=HEAT", "T"]:
        bad = corrupt(line(payload))
        assert bad.endswith(b"\r\n") and bad != line(payload)
        with pytest.raises(lp.ChecksumError):
            lp.salvage_reply(bad)


def test_faults_mangle_counts_down() -> None:
    faults = Faults(garbage=1, stray=1, bad_checksum=1, no_checksum=1)
    good = line("SP 20.0")
    first = faults.mangle(good)
    assert first.startswith(STRAY_NOISE) and b"*" not in first[len(STRAY_NOISE) :]
    assert faults.mangle(good) == good
    faults.bad_checksum = 1
    with pytest.raises(lp.ChecksumError, match="wrong"):
        lp.decode_line(faults.mangle(good), require_checksum=True)
    faults.silent_until = 10.0
    assert faults.silent(5.0) and not faults.silent(10.0)
    faults.clear()
    assert faults == Faults()


# --- on the wire -----------------------------------------------------------------------


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[FakeDevice]:
    device = FakeDevice(time_constant_s=1e6)  # a temperature that holds still
    await device.start(pty_link=tmp_path / "tty", tcp_port=0, panel_port=0)
    try:
        yield device
    finally:
        await device.stop()


async def exchange(port: serial.Serial, data: bytes) -> bytes:
    """Write a request with pyserial and read one reply line, off the loop."""

    def work() -> bytes:
        port.reset_input_buffer()
        port.write(data)
        return bytes(port.read_until(b"\n"))

    return await asyncio.to_thread(work)


async def test_pty_serves_pyserial(fake: FakeDevice) -> None:
    assert fake.pty_link is not None
    port = serial.serial_for_url(fake.pty_link, baudrate=9600, timeout=1.0, exclusive=True)
    try:
        assert await exchange(port, line("GET SP")) == line("SP 20.0")
        assert await exchange(port, b"GET LIMITS\n") == line("LIMITS 5.0 35.0 0.5", False)
        assert await exchange(port, b"GET SP*00\r\n") == line("ERR CHECKSUM")
        assert await exchange(port, b"X" * 100 + b"\r\n") == line("ERR SYNTAX", False)
        assert await exchange(port, line("SET SP 24")) == line("OK SP 24.0")
        assert [w.channel for w in fake.writes] == ["pty"]
    finally:
        port.close()


async def test_pty_unplug_makes_the_port_fail_and_the_link_vanish(fake: FakeDevice) -> None:
    assert fake.pty_link is not None
    link = Path(fake.pty_link)
    port = serial.serial_for_url(fake.pty_link, timeout=1.0)
    fake.fault("UNPLUG", 0.3)
    await fake.wait_for(lambda: not link.exists())
    # What pyserial raises for a hung-up tty varies by call: the driver takes all three.
    with pytest.raises((serial.SerialException, OSError, termios.error)):
        await exchange(port, line("GET SP"))
    port.close()
    with pytest.raises(serial.SerialException) as caught:
        serial.serial_for_url(fake.pty_link)
    assert caught.value.errno == errno.ENOENT
    await fake.wait_for(lambda: fake.plug_count == 1)
    assert await asyncio.to_thread(link.exists)
    port = serial.serial_for_url(fake.pty_link, timeout=1.0)
    try:
        assert await exchange(port, line("GET SP")) == line("SP 20.0")
    finally:
        port.close()


async def tcp(address: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*address)


async def ask(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], data: bytes) -> bytes:
    reader, writer = conn
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readline(), 2.0)


def tcp_address(url: str | None) -> tuple[str, int]:
    assert url is not None
    host, port = url.split("://")[1].rsplit(":", 1)
    return host, int(port)


async def test_tcp_clients_take_turns_and_get_their_own_replies(fake: FakeDevice) -> None:
    address = tcp_address(fake.tcp_url)
    a, b = await tcp(address), await tcp(address)
    try:
        fake.fault("SLOW", 100)
        # One transaction at a time on the line: b's request waits for a's slow one,
        # and each reply lands on its own connection.
        a[1].write(line("GET LIMITS"))
        await a[1].drain()
        await fake.wait_for(lambda: len(fake.requests) == 1)
        assert await ask(b, line("GET SP")) == line("SP 20.0")
        assert await asyncio.wait_for(a[0].readline(), 2.0) == line("LIMITS 5.0 35.0 0.5")
        first, second = fake.requests
        assert (first.client, second.client, second.other_client) == ("tcp-1", "tcp-2", "tcp-1")
        assert second.at >= first.at + 0.1
    finally:
        for _, writer in (a, b):
            writer.close()


async def test_panel(fake: FakeDevice) -> None:
    panel = await tcp(tcp_address(fake.panel_url))
    device = await tcp(tcp_address(fake.tcp_url))
    try:
        assert await ask(panel, b"PANEL SP 25.2\n") == line("OK SP 25.0", False)
        assert await ask(device, line("GET SP")) == line("SP 25.0")
        assert fake.writes == [] and [c.stored for c in fake.core.panel_changes] == [25.0]
        assert await ask(panel, line("PANEL SP 40")) == line("ERR RANGE 5.0 35.0")
        assert await ask(panel, b"GET STATE\n") == line(
            f"STATE SP=25.0 T={fake.state().temperature} OUT=100 MODE=HEAT", False
        )
        assert await ask(panel, b"FAULT GARBAGE 1\n") == b"OK\r\n"
        with pytest.raises(lp.ChecksumError):
            lp.salvage_reply(await ask(device, line("GET SP")))
        assert await ask(device, line("GET SP")) == line("SP 25.0")
        assert await ask(panel, b"FAULT FIRE 1\n") == line("ERR SYNTAX", False)
        assert await ask(panel, b"FAULT SILENT 30\n") == b"OK\r\n"
        device[1].write(line("GET SP"))
        await fake.wait_for(lambda: len(fake.requests) == 4)
        assert await ask(panel, b"FAULT CLEAR\n") == b"OK\r\n"
        assert await ask(device, line("GET SP")) == line("SP 25.0")
        assert await ask(panel, b"FAULT SLOW 50\n") == b"OK\r\n"
        assert fake.faults.slow_s == 0.05
    finally:
        for _, writer in (panel, device):
            writer.close()


async def test_tcp_unplug_drops_and_refuses_connections(fake: FakeDevice) -> None:
    address = tcp_address(fake.tcp_url)
    panel = await tcp(tcp_address(fake.panel_url))
    client = await tcp(address)
    try:
        assert await ask(panel, b"FAULT UNPLUG 0.3\n") == b"OK\r\n"
        assert await asyncio.wait_for(client[0].read(), 2.0) == b""  # dropped
        with pytest.raises(ConnectionRefusedError):
            await tcp(address)
        await fake.wait_for(lambda: fake.plug_count == 1)
        again = await tcp(address)
        assert await ask(again, line("GET SP")) == line("SP 20.0")
        again[1].close()
        # The panel stayed up all along.
        assert await ask(panel, b"ID\n") == line("ID SIM-TSTAT 1.0.0 SIM0001", False)
    finally:
        panel[1].close()
        client[1].close()


async def test_clear_ends_an_unplug_early(fake: FakeDevice) -> None:
    fake.fault("UNPLUG", 60)
    await fake.wait_for(lambda: fake.pty_link is not None and not Path(fake.pty_link).exists())
    fake.fault("CLEAR")
    await fake.wait_for(lambda: fake.plug_count == 1)
    assert not fake.unplugged


async def test_ready_line_names_endpoints_as_urls(fake: FakeDevice) -> None:
    words = fake.ready_line().split()
    assert words[0::2] == ["device", "device", "panel"]
    assert words[3].startswith("socket://127.0.0.1:")
    assert words[5].startswith("tcp://127.0.0.1:")
    assert words[1] == fake.pty_link


async def test_a_device_needs_an_endpoint() -> None:
    with pytest.raises(ValueError):
        await FakeDevice().start()
