from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.controller import line_protocol as lp
from agent.controller.interface import ControllerState, Limits, Mode

# --- framing ---------------------------------------------------------------------------


def test_checksum_is_the_xor_of_the_bytes() -> None:
    # The classic NMEA example sentence.
    assert lp.checksum(b"GPGLL,5300.97914,N,00259.98174,E,125926,A") == 0x28
    assert lp.checksum(b"") == 0


def test_encode_line_appends_checksum_and_crlf() -> None:
    assert lp.encode_line("GET SP") == b"GET SP*%02X\r\n" % lp.checksum(b"GET SP")
    assert lp.encode_line("GET SP", with_checksum=False) == b"GET SP\r\n"


@pytest.mark.parametrize("payload", ["A*B", "caf\u00e9", "A\rB", "X" * 78])
def test_encode_line_refuses_what_cannot_be_framed(payload: str) -> None:
    with pytest.raises((lp.FramingError, UnicodeEncodeError)):
        lp.encode_line(payload)


def test_longest_line_is_80_bytes_with_crlf() -> None:
    assert len(lp.encode_line("X" * 75)) == 80
    with pytest.raises(lp.FramingError):
        lp.encode_line("X" * 76)


printable = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters="*"),
    max_size=75,
)


@given(printable, st.booleans())
def test_decode_inverts_encode(payload: str, with_checksum: bool) -> None:
    line = lp.encode_line(payload, with_checksum=with_checksum)
    frame = lp.decode_line(line, require_checksum=False)
    assert frame == lp.Frame(payload, with_checksum)


@given(printable.filter(bool), st.integers(0, 74), st.integers(1, 0x5E))
def test_any_single_byte_change_breaks_the_checksum(payload: str, where: int, flip: int) -> None:
    line = bytearray(lp.encode_line(payload))
    index = where % len(payload)
    changed = line[index] ^ flip
    if not 0x20 <= changed < 0x7F or changed == ord("*"):
        return
    line[index] = changed
    with pytest.raises(lp.ChecksumError):
        lp.decode_line(bytes(line), require_checksum=True)


def test_decode_line_cases() -> None:
    assert lp.decode_line(b"SP 21.5*3B\r\n", require_checksum=True) == lp.Frame("SP 21.5", True)
    with pytest.raises(lp.ChecksumError, match="missing"):
        lp.decode_line(b"SP 21.5\r\n", require_checksum=True)
    with pytest.raises(lp.ChecksumError, match="wrong"):
        lp.decode_line(b"SP 21.5*00", require_checksum=True)
    assert lp.decode_line(b"sp*%02x" % lp.checksum(b"sp"), require_checksum=True).payload == "sp"
    with pytest.raises(lp.FramingError):
        lp.decode_line(b"SP\x0021.5", require_checksum=False)
    with pytest.raises(lp.FramingError):
        lp.decode_line(b"SP*21.5", require_checksum=False)
    with pytest.raises(lp.FramingError):
        lp.decode_line(b"X" * 79, require_checksum=False)


def test_salvage_skips_stray_bytes_before_the_reply() -> None:
    reply = lp.encode_line("SP 21.5")
    assert lp.salvage_reply(reply) == lp.Frame("SP 21.5", True)
    assert lp.salvage_reply(b"\x00\xff~#" + reply) == lp.Frame("SP 21.5", True)
    assert lp.salvage_reply(b"junk SP" + reply) == lp.Frame("SP 21.5", True)


def test_salvage_calls_a_noise_line_noise_and_a_bad_line_an_error() -> None:
    assert lp.salvage_reply(b"\x00\xff\x13 \r\n") is None
    assert lp.salvage_reply(b"") is None
    with pytest.raises(lp.ChecksumError, match="wrong"):
        lp.salvage_reply(b"SP 21.5*00\r\n")
    with pytest.raises(lp.ChecksumError, match="missing"):
        lp.salvage_reply(b"\x00SP 21.5\r\n")


@given(
    st.binary(max_size=40),
    st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    printable.map(lambda p: p[:60]),
)
def test_salvage_finds_a_reply_behind_noise(noise: bytes, first: str, rest: str) -> None:
    # Replies start with an upper-case keyword; noise is anything but a line feed.
    noise = noise.replace(b"\n", b"")
    payload = first + rest
    frame = lp.salvage_reply(noise + lp.encode_line(payload))
    assert frame is not None
    assert frame.checksummed
    # The earliest valid frame wins; it ends with the reply itself.
    assert frame.payload.endswith(payload) or payload.endswith(frame.payload)


def test_line_splitter() -> None:
    splitter = lp.LineSplitter(max_line=10)
    assert splitter.feed(b"AB") == []
    assert splitter.feed(b"C\r\nDE\nF") == [b"ABC", b"DE"]
    assert splitter.pending == b"F"
    assert splitter.feed(b"0123456789") == []  # too long: dropped
    assert splitter.feed(b"XYZ\nOK\n") == [None, b"OK"]
    splitter.feed(b"half")
    splitter.clear()
    assert splitter.feed(b"\n") == [b""]


@given(st.lists(st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"")), max_size=8), st.data())
def test_line_splitter_is_independent_of_chunking(lines: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    splitter = lp.LineSplitter(max_line=1000)
    got: list[bytes | None] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got += splitter.feed(stream[start:end])
    assert got == [line.rstrip(b"\r") for line in lines]


# --- numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"), [(21.5, "21.5"), (5, "5.0"), (0.05, "0.05"), (-0.0, "0.0"), (-3.25, "-3.25")]
)
def test_format_number(value: float, text: str) -> None:
    assert lp.format_number(value) == text


@pytest.mark.parametrize("text", ["nan", "inf", "1e3", "", "-", "21,5", "0x10", "21.5.1"])
def test_parse_number_rejects_all_but_plain_decimals(text: str) -> None:
    with pytest.raises(ValueError):
        lp.parse_number(text)


# --- requests --------------------------------------------------------------------------

REQUESTS: list[tuple[lp.Request, str]] = [
    (lp.Identify(), "ID"),
    (lp.GetSetpoint(), "GET SP"),
    (lp.SetSetpoint(21.5), "SET SP 21.5"),
    (lp.GetTemperature(), "GET T"),
    (lp.GetState(), "GET STATE"),
    (lp.GetLimits(), "GET LIMITS"),
]


@pytest.mark.parametrize(("request_", "text"), REQUESTS)
def test_every_request_formats_and_parses(request_: lp.Request, text: str) -> None:
    assert lp.format_request(request_) == text
    assert lp.parse_request(text) == request_
    assert lp.parse_request(text.lower()) == request_


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "SYNTAX"),
        ("GET", "SYNTAX"),
        ("SET", "SYNTAX"),
        ("SET SP", "SYNTAX"),
        ("SET SP abc", "SYNTAX"),
        ("SET SP nan", "SYNTAX"),
        ("SET SP 1 2", "SYNTAX"),
        ("GET SP now", "SYNTAX"),
        ("ID please", "SYNTAX"),
        ("GET HUMIDITY", "UNKNOWN"),
        ("SET T 20", "UNKNOWN"),
        ("REBOOT", "UNKNOWN"),
    ],
)
def test_bad_requests_name_their_error(text: str, code: str) -> None:
    with pytest.raises(lp.RequestError) as caught:
        lp.parse_request(text)
    assert caught.value.code == code


# --- replies ---------------------------------------------------------------------------

STATE = ControllerState(21.5, 19.3, 42, Mode.HEAT)
REPLIES: list[tuple[lp.Reply, str]] = [
    (lp.IdReply("SIM-TSTAT", "1.0.0", "SIM0001"), "ID SIM-TSTAT 1.0.0 SIM0001"),
    (lp.SetpointReply(21.5), "SP 21.5"),
    (lp.SetpointStored(22.0), "OK SP 22.0"),
    (lp.TemperatureReply(-3.5), "T -3.5"),
    (lp.StateReply(STATE), "STATE SP=21.5 T=19.3 OUT=42 MODE=HEAT"),
    (lp.LimitsReply(Limits(5.0, 35.0, 0.5)), "LIMITS 5.0 35.0 0.5"),
    (lp.OkReply(), "OK"),
    (lp.ErrorReply("RANGE", ("5.0", "35.0")), "ERR RANGE 5.0 35.0"),
    (lp.ErrorReply("CHECKSUM"), "ERR CHECKSUM"),
]


@pytest.mark.parametrize(("reply", "text"), REPLIES)
def test_every_reply_formats_and_parses(reply: lp.Reply, text: str) -> None:
    assert lp.format_reply(reply) == text
    assert lp.parse_reply(text) == reply


def test_state_fields_may_come_in_any_order() -> None:
    reply = lp.parse_reply("STATE MODE=HEAT OUT=42 T=19.3 SP=21.5")
    assert reply == lp.StateReply(STATE)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "SP",
        "SP hot",
        "SP 1 2",
        "T nan",
        "ID only-two parts",
        "STATE SP=21.5 T=19.3 OUT=42",
        "STATE SP=21.5 T=19.3 OUT=101 MODE=HEAT",
        "STATE SP=21.5 T=19.3 OUT=4.5 MODE=HEAT",
        "STATE SP=21.5 T=19.3 OUT=42 MODE=BOIL",
        "STATE SP=21.5 SP=21.5 T=19.3 OUT=42 MODE=HEAT",
        "STATE SP21.5 T=19.3 OUT=42 MODE=HEAT",
        "LIMITS 35.0 5.0 0.5",
        "LIMITS 5.0 35.0 0",
        "LIMITS 5.0 35.0",
        "ERR",
        "HELLO",
    ],
)
def test_nonsense_replies_are_protocol_errors(text: str) -> None:
    with pytest.raises(lp.ProtocolError):
        lp.parse_reply(text)


@given(
    st.integers(-400, 900).map(lambda n: n / 10),
    st.integers(-400, 900).map(lambda n: n / 10),
    st.integers(0, 100),
    st.sampled_from(list(Mode)),
)
def test_state_replies_round_trip(
    setpoint: float, temperature: float, out: int, mode: Mode
) -> None:
    reply = lp.StateReply(ControllerState(setpoint, temperature, out, mode))
    line = lp.encode_line(lp.format_reply(reply))
    frame = lp.decode_line(line, require_checksum=True)
    assert lp.parse_reply(frame.payload) == reply


# --- addressed mode ------------------------------------------------------------------


def test_addressed_payloads_round_trip() -> None:
    assert lp.with_address(3, "GET SP") == "@3 GET SP"
    assert lp.with_address(None, "GET SP") == "GET SP"
    assert lp.split_address("@3 SP 21.5") == (3, "SP 21.5")
    assert lp.split_address("@247 OK SP 20.0") == (247, "OK SP 20.0")
    assert lp.split_address("SP 21.5") == (None, "SP 21.5")


@pytest.mark.parametrize(
    "payload",
    ["@0 GET SP", "@248 GET SP", "@x GET SP", "@3GET SP", "@ 3 X", "@03 GET SP", "@-1 GET SP"],
)
def test_bad_address_prefixes(payload: str) -> None:
    with pytest.raises(lp.ProtocolError):
        lp.split_address(payload)


def test_with_address_rejects_out_of_range() -> None:
    for bad in (0, 248, -1):
        with pytest.raises(ValueError):
            lp.with_address(bad, "GET SP")


def test_addressed_reply_is_salvaged_from_noise_and_checksummed_whole() -> None:
    line = lp.encode_line("@12 SP 21.5")
    assert line == b"@12 SP 21.5*" + b"%02X" % lp.checksum(b"@12 SP 21.5") + b"\r\n"
    frame = lp.salvage_reply(b"\x00\xfe" + line)
    assert frame is not None and frame.payload == "@12 SP 21.5"
    # The prefix is covered by the checksum.
    tampered = line.replace(b"@12", b"@13")
    with pytest.raises(lp.ChecksumError):
        lp.decode_line(tampered, require_checksum=True)


@given(st.one_of(st.none(), st.integers(1, 247)), st.sampled_from(["GET SP", "SP 21.5", "OK"]))
def test_address_round_trip_property(address: int | None, payload: str) -> None:
    assert lp.split_address(lp.with_address(address, payload)) == (address, payload)
