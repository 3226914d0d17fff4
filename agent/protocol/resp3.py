"""The RESP3 subset of the state store (protocol.md §2 and §7).

Requests are arrays of binary-safe bulk strings; responses are `+OK`, `:n`, `$n`, `$-1` or
`-ERR text`; notifications are arrays `NOTIFY SET VALUE v` or `NOTIFY DELETE`. Every decoder
consumes its input exactly and raises `Resp3Error` for anything else, never another error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

CRLF = b"\r\n"
# Longer length or integer fields than this cannot describe a payload MQTT can carry.
_MAX_NUMBER_DIGITS = 19
_MAX_ARRAY_LENGTH = 1 << 20


class Resp3Error(ValueError):
    """The bytes are not a well-formed message of the expected kind."""


@dataclass(frozen=True, slots=True)
class SimpleString:
    text: str


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """`-ERR <text>`: `text` excludes the `ERR ` prefix when present."""

    text: str


OK = SimpleString("OK")

Response: TypeAlias = SimpleString | ErrorReply | int | bytes | None
"""`+OK`, `-ERR text`, `:n`, `$n` (bytes) or `$-1` (None)."""

Value: TypeAlias = SimpleString | ErrorReply | int | bytes | list["Value"] | None


@dataclass(frozen=True, slots=True)
class Notification:
    kind: Literal["SET", "DELETE"]
    value: bytes | None = None


# ---------------------------------------------------------------------------- encoding


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def encode_request(args: Sequence[bytes]) -> bytes:
    if not args:
        raise Resp3Error("a request needs at least the command")
    return b"*%d\r\n" % len(args) + b"".join(_bulk(a) for a in args)


def _line_text(text: str) -> bytes:
    raw = text.encode()
    if b"\r" in raw or b"\n" in raw:
        raise Resp3Error(f"line text cannot contain CR or LF: {text!r}")
    return raw


def encode_response(response: Response) -> bytes:
    if isinstance(response, SimpleString):
        return b"+" + _line_text(response.text) + CRLF
    if isinstance(response, ErrorReply):
        return b"-ERR " + _line_text(response.text) + CRLF
    if response is None:
        return b"$-1\r\n"
    if isinstance(response, bool):
        raise Resp3Error("a boolean is not a RESP3 response of this subset")
    if isinstance(response, int):
        return b":%d\r\n" % response
    return _bulk(response)


def encode_notification(notification: Notification) -> bytes:
    if notification.kind == "SET":
        return encode_request([b"NOTIFY", b"SET", b"VALUE", notification.value or b""])
    return encode_request([b"NOTIFY", b"DELETE"])


# ---------------------------------------------------------------------------- decoding


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def line(self) -> bytes:
        end = self.data.find(CRLF, self.pos)
        if end < 0:
            raise Resp3Error("truncated: missing CRLF")
        line = self.data[self.pos : end]
        self.pos = end + 2
        return line

    def number(self, field: bytes, *, allow_negative: bool) -> int:
        digits = field[1:] if allow_negative and field.startswith(b"-") else field
        if not digits or len(digits) > _MAX_NUMBER_DIGITS or not digits.isdigit():
            raise Resp3Error(f"not a number: {field[:32]!r}")
        return int(field)

    def take(self, length: int) -> bytes:
        end = self.pos + length
        if end + 2 > len(self.data):
            raise Resp3Error("truncated bulk string")
        if self.data[end : end + 2] != CRLF:
            raise Resp3Error("bulk string not terminated by CRLF")
        chunk = self.data[self.pos : end]
        self.pos = end + 2
        return chunk

    def value(self, depth: int = 0) -> Value:
        if self.pos >= len(self.data):
            raise Resp3Error("truncated: no type byte")
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"$":
            length = self.number(rest, allow_negative=True)
            if length == -1:
                return None
            if length < 0:
                raise Resp3Error(f"negative bulk length {length}")
            return self.take(length)
        if kind == b":":
            return self.number(rest, allow_negative=True)
        if kind == b"+":
            return SimpleString(_text(rest))
        if kind == b"-":
            text = _text(rest)
            return ErrorReply(text[4:] if text.startswith("ERR ") else text)
        if kind == b"*":
            if depth > 0:
                raise Resp3Error("nested arrays are not part of this protocol")
            count = self.number(rest, allow_negative=False)
            if count > _MAX_ARRAY_LENGTH:
                raise Resp3Error(f"array too long: {count}")
            return [self.value(depth + 1) for _ in range(count)]
        raise Resp3Error(f"unknown type byte {kind!r}")


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise Resp3Error("line text is not UTF-8") from exc


def decode(data: bytes) -> Value:
    """Decodes exactly one value; trailing bytes are an error."""
    reader = _Reader(bytes(data))
    value = reader.value()
    if reader.pos != len(reader.data):
        raise Resp3Error(f"{len(reader.data) - reader.pos} trailing bytes")
    return value


def _bulk_array(value: Value, what: str) -> list[bytes]:
    if not isinstance(value, list) or not value:
        raise Resp3Error(f"a {what} is a non-empty array of bulk strings")
    items: list[bytes] = []
    for item in value:
        if not isinstance(item, bytes):
            raise Resp3Error(f"a {what} holds only bulk strings")
        items.append(item)
    return items


def decode_request(data: bytes) -> list[bytes]:
    return _bulk_array(decode(data), "request")


def decode_response(data: bytes) -> Response:
    value = decode(data)
    if isinstance(value, list):
        raise Resp3Error("an array is not a response")
    return value


def decode_notification(data: bytes) -> Notification:
    items = _bulk_array(decode(data), "notification")
    words = [i.upper() for i in items[:3]]
    if words[0] != b"NOTIFY" or len(items) < 2:
        raise Resp3Error("a notification starts with NOTIFY and its kind")
    if words[1] == b"SET" and len(items) == 4 and words[2] == b"VALUE":
        return Notification("SET", items[3])
    # The article says DEL, the service sends DELETE.
    if words[1] in (b"DELETE", b"DEL") and len(items) == 2:
        return Notification("DELETE")
    raise Resp3Error(f"unknown notification {b' '.join(items[:2])!r}")
