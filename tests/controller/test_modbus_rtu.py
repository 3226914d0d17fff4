"""The driver's Modbus RTU codec, checked against pymodbus's (an independent implementation)
and the simulator's, for every request it builds and every reply it reads."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.controller import modbus_rtu as rtu
from agent.simulator.rtu import crc16, parse_rtu_request

pymodbus = pytest.importorskip("pymodbus")

from pymodbus.framer import FramerRTU  # noqa: E402
from pymodbus.pdu import DecodePDU, ExceptionResponse  # noqa: E402
from pymodbus.pdu.register_message import (  # noqa: E402
    ReadHoldingRegistersRequest,
    ReadHoldingRegistersResponse,
    ReadInputRegistersRequest,
    ReadInputRegistersResponse,
    WriteMultipleRegistersRequest,
    WriteMultipleRegistersResponse,
    WriteSingleRegisterRequest,
    WriteSingleRegisterResponse,
)

units = st.integers(1, 247)
registers = st.integers(0, 0xFFFF)
counts = st.integers(1, rtu.MAX_READ)
values = st.integers(0, 0xFFFF)

CLIENT = FramerRTU(DecodePDU(is_server=False))
SERVER = FramerRTU(DecodePDU(is_server=True))
READS = {
    rtu.READ_HOLDING: (ReadHoldingRegistersRequest, ReadHoldingRegistersResponse),
    rtu.READ_INPUT: (ReadInputRegistersRequest, ReadInputRegistersResponse),
}


@given(units, st.sampled_from(sorted(READS)), registers, counts)
def test_read_requests_are_pymodbus_frames(
    unit: int, function: int, first: int, count: int
) -> None:
    first = min(first, 0x10000 - count)
    request_type, _ = READS[function]
    ours = rtu.read_request(unit, function, first, count)
    assert ours == CLIENT.buildFrame(request_type(address=first, count=count, dev_id=unit))
    assert crc16(ours) == 0  # the simulator's CRC agrees
    assert parse_rtu_request(ours).address == unit
    assert rtu.reply_bytes(ours) == 5 + 2 * count


@given(units, st.sampled_from([rtu.WRITE_SINGLE, rtu.WRITE_MULTIPLE]), registers, values)
def test_write_requests_are_pymodbus_frames(
    unit: int, function: int, register: int, raw: int
) -> None:
    ours = rtu.write_request(unit, function, register, raw)
    if function == rtu.WRITE_SINGLE:
        theirs = WriteSingleRegisterRequest(address=register, registers=[raw], dev_id=unit)
    else:
        theirs = WriteMultipleRegistersRequest(address=register, registers=[raw], dev_id=unit)
    assert ours == CLIENT.buildFrame(theirs)
    assert rtu.reply_bytes(ours) == 8


@given(units, st.sampled_from(sorted(READS)), st.lists(values, min_size=1, max_size=rtu.MAX_READ))
def test_read_replies_from_pymodbus_are_read(unit: int, function: int, data: list[int]) -> None:
    request = rtu.read_request(unit, function, 0, len(data))
    _, response_type = READS[function]
    reply = SERVER.buildFrame(response_type(registers=data, dev_id=unit))
    assert rtu.reply_length(reply[: rtu.HEADER_BYTES]) == len(reply) == rtu.reply_bytes(request)
    assert rtu.parse_reply(request, reply) == tuple(data)


@given(units, registers, values)
def test_write_echoes_and_refusals_from_pymodbus_are_read(
    unit: int, register: int, raw: int
) -> None:
    request = rtu.write_request(unit, rtu.WRITE_SINGLE, register, raw)
    echo = SERVER.buildFrame(
        WriteSingleRegisterResponse(address=register, registers=[raw], dev_id=unit)
    )
    assert rtu.reply_length(echo[:2]) == len(echo) == 8
    assert rtu.parse_reply(request, echo) is None
    multiple = rtu.write_request(unit, rtu.WRITE_MULTIPLE, register, raw)
    echo = SERVER.buildFrame(WriteMultipleRegistersResponse(address=register, count=1, dev_id=unit))
    assert rtu.parse_reply(multiple, echo) is None
    refusal = SERVER.buildFrame(
        ExceptionResponse(rtu.WRITE_SINGLE, rtu.ILLEGAL_DATA_VALUE, device_id=unit)
    )
    assert rtu.reply_length(refusal[:2]) == len(refusal) == rtu.EXCEPTION_REPLY_BYTES
    assert rtu.parse_reply(request, refusal) == rtu.ExceptionReply(rtu.ILLEGAL_DATA_VALUE)


def test_replies_that_are_not_answers() -> None:
    request = rtu.read_request(7, rtu.READ_HOLDING, 0, 2)
    good = SERVER.buildFrame(ReadHoldingRegistersResponse(registers=[1, 2], dev_id=7))
    for bad, why in [
        (good[:-1] + bytes([good[-1] ^ 1]), "CRC"),
        (good[:5], "CRC"),
        (SERVER.buildFrame(ReadHoldingRegistersResponse(registers=[1, 2], dev_id=8)), "unit 8"),
        (SERVER.buildFrame(ReadHoldingRegistersResponse(registers=[1], dev_id=7)), "data bytes"),
        (SERVER.buildFrame(ReadInputRegistersResponse(registers=[1, 2], dev_id=7)), "function"),
    ]:
        with pytest.raises(rtu.FrameError, match=why):
            rtu.parse_reply(request, bad)


@given(st.binary(max_size=300))
def test_any_bytes_are_a_reply_or_a_frame_error(reply: bytes) -> None:
    request = rtu.read_request(1, rtu.READ_HOLDING, 0, 2)
    with contextlib.suppress(rtu.FrameError):
        rtu.parse_reply(request, reply)
    rtu.reply_length(reply[:3])


@pytest.mark.parametrize(
    "call",
    [
        lambda: rtu.read_request(0, 3, 0, 1),
        lambda: rtu.read_request(248, 3, 0, 1),
        lambda: rtu.read_request(1, 6, 0, 1),
        lambda: rtu.read_request(1, 3, 0, 126),
        lambda: rtu.read_request(1, 3, 0xFFFF, 2),
        lambda: rtu.write_request(1, 3, 0, 0),
        lambda: rtu.write_request(1, 6, 0, 0x10000),
    ],
)
def test_requests_that_cannot_be_made(call: object) -> None:
    with pytest.raises(ValueError):
        call()  # type: ignore[operator]
