"""The fake line's pure core in addressed mode: parsing once, answering with the prefix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.controller import line_protocol as lp
from agent.simulator.core import (
    INVALID,
    NO_ADDRESS,
    DeviceCore,
    Faults,
    append_bounded,
    line_time_s,
    parse_panel_command,
    parse_text_request,
)


def line(payload: str, checksum: bool = True) -> bytes:
    return lp.encode_line(payload, with_checksum=checksum)


@pytest.mark.parametrize(
    ("text", "address", "kind", "value"),
    [
        ("@3 GET SP", 3, "GET SP", None),
        ("@247 SET SP 21.5", 247, "SET SP", 21.5),
        ("@12 get state", 12, "GET STATE", None),
        ("GET LIMITS", None, "GET LIMITS", None),
        ("@1 ID", 1, "ID", None),
        ("@3 HELLO", 3, INVALID, None),
        ("@0 GET SP", NO_ADDRESS, INVALID, None),
        ("@248 GET SP", NO_ADDRESS, INVALID, None),
        ("@03 GET SP", NO_ADDRESS, INVALID, None),
        ("@3GET SP", NO_ADDRESS, INVALID, None),
        ("@ GET SP", NO_ADDRESS, INVALID, None),
    ],
)
def test_parse_addressed_requests(
    text: str, address: int | None, kind: str, value: float | None
) -> None:
    request = parse_text_request(line(text).rstrip(b"\r\n"))
    assert request is not None
    assert (request.address, request.kind, request.value) == (address, kind, value)


def test_parse_errors_keep_the_address() -> None:
    wrong = parse_text_request(b"@5 GET SP*00")
    assert wrong is not None and (wrong.address, wrong.error) == (5, "CHECKSUM")
    noisy = parse_text_request(b"@5 GET\x00SP")
    assert noisy is not None and (noisy.address, noisy.error) == (5, "SYNTAX")
    overlong = parse_text_request(None)
    assert overlong is not None and (overlong.address, overlong.error) == (None, "SYNTAX")
    assert parse_text_request(b"  ") is None


@given(st.integers(1, 247), st.sampled_from(["GET SP", "GET LIMITS", "SET SP 22", "ID"]))
def test_the_reply_carries_the_prefix_and_a_checksum_over_it(address: int, text: str) -> None:
    core = DeviceCore(now=0.0, time_constant_s=1e6)
    request = parse_text_request(line(f"@{address} {text}"))
    assert request is not None
    reply = core.answer_text(request, 0.0, "tcp")
    frame = lp.decode_line(reply, require_checksum=True)
    prefix, payload = lp.split_address(frame.payload)
    assert prefix == address
    lp.parse_reply(payload)
    # The checksum covers the prefix: without it the same text would sum differently.
    assert reply != line(f"@{address} ") and lp.checksum(frame.payload.encode()) == int(
        reply.rstrip(b"\r\n")[-2:], 16
    )
    assert lp.salvage_reply(reply) == frame


def test_addressed_errors_carry_the_prefix() -> None:
    core = DeviceCore(now=0.0)
    wrong = parse_text_request(b"@5 GET SP*00")
    assert wrong is not None
    assert core.answer_text(wrong, 0.0, "pty") == line("@5 ERR CHECKSUM")
    unknown = parse_text_request(b"@5 HELLO")
    assert unknown is not None
    assert core.answer_text(unknown, 0.0, "pty") == line("@5 ERR UNKNOWN", False)


def test_a_point_to_point_device_ignores_addressed_requests() -> None:
    core = DeviceCore(now=0.0)
    assert core.respond(line("@1 GET SP"), 0.0) is None
    assert core.respond(line("@x GET SP"), 0.0) is None
    assert core.respond(line("GET SP"), 0.0) == line("SP 20.0")


@pytest.mark.parametrize(
    ("kind", "amount", "expected"),
    [
        ("UNPLUG", 2, Faults(unplugged_until=12.0)),
        ("SILENT", 0.5, Faults(silent_until=10.5)),
        ("SLOW", 250, Faults(slow_s=0.25)),
        ("GARBAGE", 3, Faults(garbage=3)),
        ("STRAY", 1, Faults(stray=1)),
        ("BADSUM", 2, Faults(bad_checksum=2)),
        ("NOSUM", 4, Faults(no_checksum=4)),
        ("LATE", 300, Faults(late_s=0.3)),
        ("ASADDRESS", 7, Faults(as_address=7)),
    ],
)
def test_faults_set(kind: str, amount: float, expected: Faults) -> None:
    faults = Faults()
    faults.set(kind, amount, now=10.0)
    assert faults == expected
    faults.set("CLEAR", 0, now=11.0)
    assert faults == Faults()


def test_unknown_fault() -> None:
    with pytest.raises(ValueError, match="FIRE"):
        Faults().set("FIRE", 1, now=0.0)


@pytest.mark.parametrize("words", ["FAULT ASADDRESS 0", "FAULT ASADDRESS 248", "FAULT LATE -1"])
def test_a_fault_with_a_bad_amount_is_a_syntax_error(words: str) -> None:
    with pytest.raises(lp.RequestError):
        parse_panel_command(words)


def test_a_unit_at_the_wrong_address_answers_as_that_one() -> None:
    reply = Faults(as_address=5).mangle(line("@2 SP 20.0"))
    assert reply == line("@5 SP 20.0")
    assert Faults(as_address=5).mangle(line("@2 SP 20.0", checksum=False)) == line(
        "@5 SP 20.0", checksum=False
    )


def test_unplugged_and_silent_end_in_time() -> None:
    faults = Faults(unplugged_until=5.0, silent_until=3.0)
    assert faults.unplugged(4.9) and not faults.unplugged(5.0)
    assert faults.silent(2.9) and not faults.silent(3.0)


def test_line_time() -> None:
    assert line_time_s(96, 9600) == pytest.approx(0.1)
    assert line_time_s(8, 19200, 11) == pytest.approx(88 / 19200)


def test_records_are_bounded() -> None:
    records: list[int] = []
    for value in range(12):
        append_bounded(records, value, 5)
    assert records == [7, 8, 9, 10, 11]
    core = DeviceCore(now=0.0, record_limit=3)
    for value in (21, 22, 23, 24):
        core.store_setpoint(value, 0.0, "pty")
    assert [w.value for w in core.writes] == [22, 23, 24]
