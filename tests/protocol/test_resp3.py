from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.protocol.resp3 import (
    OK,
    ErrorReply,
    Notification,
    Resp3Error,
    SimpleString,
    decode,
    decode_notification,
    decode_request,
    decode_response,
    encode_notification,
    encode_request,
    encode_response,
)

# The byte examples of protocol.md §2 and §7.
EXAMPLES = [
    (
        b"*6\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n$3\r\nNEX\r\n$2\r\nPX\r\n$4\r\n1000\r\n",
        [b"SET", b"key", b"value", b"NEX", b"PX", b"1000"],
    ),
    (b"*2\r\n$3\r\nGET\r\n$7\r\nSETKEY2\r\n", [b"GET", b"SETKEY2"]),
    (b"*3\r\n$4\r\nVDEL\r\n$7\r\nSETKEY2\r\n$3\r\nABC\r\n", [b"VDEL", b"SETKEY2", b"ABC"]),
    (
        b"*3\r\n$9\r\nKEYNOTIFY\r\n$7\r\nSOMEKEY\r\n$4\r\nSTOP\r\n",
        [b"KEYNOTIFY", b"SOMEKEY", b"STOP"],
    ),
]


@pytest.mark.parametrize(("wire", "args"), EXAMPLES)
def test_protocol_examples(wire: bytes, args: list[bytes]) -> None:
    assert encode_request(args) == wire
    assert decode_request(wire) == args


@pytest.mark.parametrize(
    ("wire", "response"),
    [
        (b"+OK\r\n", OK),
        (b":1\r\n", 1),
        (b":0\r\n", 0),
        (b":-1\r\n", -1),
        (b"$5\r\nhello\r\n", b"hello"),
        (b"$0\r\n\r\n", b""),
        (b"$-1\r\n", None),
        (b"-ERR syntax error\r\n", ErrorReply("syntax error")),
    ],
)
def test_responses(wire: bytes, response: object) -> None:
    assert decode_response(wire) == response
    assert encode_response(response) == wire  # type: ignore[arg-type]


def test_error_without_err_prefix_keeps_its_text() -> None:
    assert decode_response(b"-WRONGTYPE bad\r\n") == ErrorReply("WRONGTYPE bad")


def test_notifications() -> None:
    set_wire = b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$4\r\n21.5\r\n"
    assert encode_notification(Notification("SET", b"21.5")) == set_wire
    assert decode_notification(set_wire) == Notification("SET", b"21.5")
    delete_wire = b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"
    assert encode_notification(Notification("DELETE")) == delete_wire
    assert decode_notification(delete_wire) == Notification("DELETE")
    # The article's form.
    assert decode_notification(b"*2\r\n$6\r\nNOTIFY\r\n$3\r\nDEL\r\n") == Notification("DELETE")


@pytest.mark.parametrize(
    "wire",
    [
        b"",
        b"*",
        b"*1\r\n",
        b"*1\r\n$3\r\nGE",
        b"*1\r\n$3\r\nGETX\r\n",  # wrong length
        b"*1\r\n$3\r\nGET",  # missing CRLF
        b"*1\r\n$3\r\nGET\n",
        b"*1\r\n$-2\r\nGET\r\n",  # negative length
        b"*1\r\n$99999999999999999999999\r\nGET\r\n",  # huge length
        b"*1\r\n$1000\r\nGET\r\n",
        b"*-1\r\n",
        b"*1\r\n$x\r\nGET\r\n",
        b"*1\r\n$\r\n\r\n",
        b"*1\r\n$3\r\nGET\r\nextra",  # trailing bytes
        b"*0\r\n",  # no command
        b"*1\r\n:1\r\n",  # wrong type inside
        b"*1\r\n$-1\r\n",  # null inside
        b"*1\r\n*1\r\n$1\r\na\r\n",  # nested
        b"$3\r\nGET\r\n",  # not an array
        b"!3\r\nGET\r\n",
    ],
)
def test_malformed_requests_raise_the_codec_error(wire: bytes) -> None:
    with pytest.raises(Resp3Error):
        decode_request(wire)


@pytest.mark.parametrize(
    "wire",
    [
        b"+OK",
        b"+OK\r\nx",
        b":\r\n",
        b":1.5\r\n",
        b"$3\r\nab\r\n",
        b"*1\r\n$1\r\na\r\n",
        b"-\xff\r\n",
    ],
)
def test_malformed_responses(wire: bytes) -> None:
    with pytest.raises(Resp3Error):
        decode_response(wire)


@pytest.mark.parametrize(
    "wire",
    [
        b"*1\r\n$6\r\nNOTIFY\r\n",
        b"*2\r\n$4\r\nNOPE\r\n$3\r\nSET\r\n",
        b"*3\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n",
        b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nOTHER\r\n$1\r\nx\r\n",
        b"*3\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n$1\r\nx\r\n",
        b"+OK\r\n",
    ],
)
def test_malformed_notifications(wire: bytes) -> None:
    with pytest.raises(Resp3Error):
        decode_notification(wire)


def test_encoders_refuse_what_cannot_be_framed() -> None:
    with pytest.raises(Resp3Error):
        encode_request([])
    with pytest.raises(Resp3Error):
        encode_response(SimpleString("a\r\nb"))
    with pytest.raises(Resp3Error):
        encode_response(True)


@given(st.lists(st.binary(), min_size=1, max_size=8))
def test_request_round_trip(args: list[bytes]) -> None:
    assert decode_request(encode_request(args)) == args


@given(st.one_of(st.none(), st.binary(), st.integers(-(2**62), 2**62)))
def test_response_round_trip(value: bytes | int | None) -> None:
    assert decode_response(encode_response(value)) == value


@given(st.binary())
def test_notification_round_trip(value: bytes) -> None:
    assert decode_notification(encode_notification(Notification("SET", value))).value == value


@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_the_codec_error(data: bytes) -> None:
    for decoder in (decode, decode_request, decode_response, decode_notification):
        with contextlib.suppress(Resp3Error):
            decoder(data)


@given(st.lists(st.binary(max_size=10), min_size=1, max_size=4), st.data())
def test_mutated_requests_raise_only_the_codec_error(
    args: list[bytes], data: st.DataObject
) -> None:
    wire = bytearray(encode_request(args))
    index = data.draw(st.integers(0, len(wire) - 1))
    wire[index] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(wire)))
    for candidate in (bytes(wire), bytes(wire[:cut])):
        with contextlib.suppress(Resp3Error):
            decode_request(candidate)
