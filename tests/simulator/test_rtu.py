"""The fake line's Modbus RTU core: CRC, splitting a byte stream into frames, registers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.controller.interface import Limits, Mode
from agent.controller.modbus_map import READ_INPUT, WRITE_MULTIPLE, RegisterMap
from agent.simulator.core import DeviceCore
from agent.simulator.rtu import (
    ILLEGAL_ADDRESS,
    ILLEGAL_FUNCTION,
    ILLEGAL_VALUE,
    RTU_DAMAGE,
    RegisterView,
    RtuSplitter,
    crc16,
    exception_reply,
    parse_rtu_request,
    with_crc,
)


def read(unit: int, start: int, count: int, function: int = 3) -> bytes:
    return with_crc(bytes((unit, function)) + start.to_bytes(2, "big") + count.to_bytes(2, "big"))


def write(unit: int, register: int, raw: int) -> bytes:
    return with_crc(bytes((unit, 6)) + register.to_bytes(2, "big") + raw.to_bytes(2, "big"))


def write_multiple(unit: int, start: int, raws: list[int]) -> bytes:
    data = b"".join(r.to_bytes(2, "big") for r in raws)
    head = bytes((unit, 16)) + start.to_bytes(2, "big") + len(raws).to_bytes(2, "big")
    return with_crc(head + bytes((len(data),)) + data)


# --- CRC -------------------------------------------------------------------------------------


def test_crc_of_the_textbook_frame() -> None:
    assert with_crc(bytes.fromhex("010300000001")) == bytes.fromhex("010300000001840a")


@given(st.binary(min_size=1, max_size=254))
def test_crc_agrees_with_pymodbus_and_a_whole_frame_checks_to_zero(body: bytes) -> None:
    framer = pytest.importorskip("pymodbus.framer")
    assert with_crc(body)[-2:] == framer.FramerRTU.compute_CRC(body).to_bytes(2, "big")
    assert crc16(with_crc(body)) == 0


# --- splitting ---------------------------------------------------------------------------------

FRAMES = st.one_of(
    st.builds(read, st.integers(1, 247), st.integers(0, 0xFFFF), st.integers(1, 125)),
    st.builds(write, st.integers(1, 247), st.integers(0, 0xFFFF), st.integers(0, 0xFFFF)),
    st.builds(
        write_multiple,
        st.integers(1, 247),
        st.integers(0, 0xFFFF),
        st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=10),
    ),
    # A function without a fixed layout: told by its CRC.
    st.builds(lambda unit: with_crc(bytes((unit, 0x11))), st.integers(1, 247)),
)


@given(st.lists(FRAMES, min_size=1, max_size=8), st.data())
def test_any_chunking_yields_the_frames(frames: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    splitter = RtuSplitter()
    out: list[bytes | None] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        out += splitter.feed(stream[start:end])
    assert out == frames
    assert splitter.discarded == 0


def test_a_long_write_still_arriving_is_not_taken_for_noise() -> None:
    # Its bytes 0x14 0x25 0x1e 0x01 0xdc 0x7f hold a good CRC for a frame of function 0x25
    # (no fixed layout), ending where the first chunk ends.
    frame = write_multiple(1, 0, [9502, 476, 32512, 0, 1, 2, 3, 4, 5, 6])
    splitter = RtuSplitter()
    assert splitter.feed(frame[:12]) == []
    assert splitter.feed(frame[12:]) == [frame]
    assert splitter.discarded == 0


def test_noise_and_a_broken_frame_are_stepped_over() -> None:
    good = read(3, 0, 2)
    broken = bytearray(write(4, 0, 215))
    broken[4] ^= 0x40  # a bit error: its CRC no longer matches
    splitter = RtuSplitter()
    assert splitter.feed(b"\x00\xff" + bytes(broken) + good) == [good]
    assert splitter.discarded == 2 + len(broken)
    # A broken frame that says it is long does not swallow the requests after it.
    long_noise = bytes((5, 16, 0, 0, 0, 100, 200))
    assert splitter.feed(long_noise + good) == [good]
    assert splitter.feed(good[:3]) == []
    assert splitter.feed(good[3:]) == [good]


def test_parse_requests() -> None:
    request = parse_rtu_request(write_multiple(7, 0, [215]))
    assert (request.address, request.function, request.start, request.count) == (7, 16, 0, 1)
    assert request.values == (215,) and request.kind == "WRITE MULTIPLE"
    assert parse_rtu_request(read(2, 1, 3, READ_INPUT)).kind == "READ INPUT"
    assert parse_rtu_request(write(2, 0, 1)).kind == "WRITE"
    assert parse_rtu_request(with_crc(bytes((2, 0x11)))).kind == "FUNCTION 17"
    bad = with_crc(bytes((7, 16, 0, 0, 0, 2, 2, 0, 1)))  # two registers, one value
    assert parse_rtu_request(bad).kind == "INVALID"


# --- registers ---------------------------------------------------------------------------------


def view(register_map: RegisterMap | None = None, **core: object) -> RegisterView:
    return RegisterView(
        register_map or RegisterMap(),
        DeviceCore(now=0.0, time_constant_s=1e6, **core),  # type: ignore[arg-type]
    )


def answer(registers: RegisterView, frame: bytes) -> bytes:
    return registers.answer(parse_rtu_request(frame), 0.0, "pty")


def test_reads_give_the_model_in_tenths() -> None:
    registers = view(setpoint=21.5, temperature=-5.5)
    reply = answer(registers, read(1, 0, 2))
    assert reply == with_crc(bytes((1, 3, 4)) + (215).to_bytes(2, "big") + b"\xff\xc9")
    assert answer(registers, read(1, 1, 1, READ_INPUT))[1] == READ_INPUT


def test_writes_store_the_setpoint_and_echo() -> None:
    registers = view()
    frame = write(1, 0, 225)
    assert answer(registers, frame) == frame
    assert registers.core.model.setpoint == 22.5
    assert answer(registers, write_multiple(1, 0, [230])) == with_crc(bytes((1, 16, 0, 0, 0, 1)))
    assert [w.stored for w in registers.core.writes] == [22.5, 23.0]
    assert [a.written for a in registers.accesses] == [(225,), (230,)]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (read(1, 0, 9), ILLEGAL_ADDRESS),  # register 8 is not mapped
        (read(1, 40, 1), ILLEGAL_ADDRESS),
        (read(1, 0, 0), ILLEGAL_VALUE),
        (read(1, 0, 126), ILLEGAL_VALUE),
        (write(1, 1, 100), ILLEGAL_ADDRESS),  # the temperature is read-only
        (write(1, 0, 400), ILLEGAL_VALUE),  # 40.0 is over the limits
        (write_multiple(1, 0, [215, 200]), ILLEGAL_ADDRESS),
        (with_crc(bytes((1, 0x07))), ILLEGAL_FUNCTION),  # read exception status: not kept
        (with_crc(bytes((1, 43, 14, 3, 0))), ILLEGAL_VALUE),  # a specific object: not kept
    ],
)
def test_refusals_are_exception_replies(frame: bytes, code: int) -> None:
    registers = view()
    assert answer(registers, frame) == exception_reply(1, frame[1], code)
    assert registers.core.model.setpoint == 20.0


def test_a_unit_says_what_it_is_in_either_function() -> None:
    from agent.controller import modbus_ident as ident
    from agent.controller.interface import DeviceIdentity

    registers = view(identity=DeviceIdentity("ACME-T2", "2.1", "SN42"))
    asked = ident.device_id_request(1)
    objects = ident.parse_device_id(asked, answer(registers, asked))
    assert objects == {0: "ACME", 1: "ACME-T2", 2: "2.1 SN42"}
    asked = ident.server_id_request(1)
    assert ident.parse_server_id(asked, answer(registers, asked)) == "ACME-T2 2.1 SN42 (running)"


def test_a_full_register_map() -> None:
    full = RegisterMap(
        setpoint_register=100,
        temperature_register=200,
        output_register=201,
        mode_register=202,
        limits=None,
        min_register=110,
        max_register=111,
        step_register=112,
        scale=100,
        signed=False,
    )
    registers = view(full, limits=Limits(5.0, 30.0, 0.5))
    values = registers.registers(0.0)
    mapped = {register: raw for register, raw in values.items() if register >= 100}
    assert mapped == {100: 2000, 200: 1800, 201: 50, 202: 1, 110: 500, 111: 3000, 112: 50}
    # Beside the map's, the sim profile's registers (0..7) are served too.
    assert {register for register in values if register < 100} == set(range(8))
    assert full.mode_for(values[202]) is Mode.HEAT
    assert answer(registers, write_multiple(1, 100, [2250]))[1] == WRITE_MULTIPLE


def test_damage_breaks_the_crc() -> None:
    reply = with_crc(bytes((1, 3, 2, 0, 200)))
    for damaged in (
        RTU_DAMAGE.corrupt(reply),
        RTU_DAMAGE.wrong_checksum(reply),
        RTU_DAMAGE.no_checksum(reply),
    ):
        assert crc16(damaged) != 0


def test_a_reply_from_the_wrong_unit_id_has_a_good_crc() -> None:
    reply = with_crc(bytes((2, 3, 4, 0, 200, 0, 180)))
    moved = RTU_DAMAGE.readdress(reply, 9)
    assert moved[0] == 9 and moved[1:-2] == reply[1:-2]
    assert crc16(moved) == 0
