"""A store value or key in a line of text, the same way everywhere it is shown: by the
commands (VALUES_SHOWN in agent.client.cli) and in the logs (a key such as `floor3\\lock`
as the text it is, never a bytes repr)."""

from __future__ import annotations

# How a character that is not printable is escaped when it has a short form.
_SHORT_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_NOT_UTF8 = range(0xDC80, 0xDD00)  # a byte that is not UTF-8, as surrogateescape holds it


def show_value(value: bytes) -> str:
    """A store value (or key) in a line of text, as VALUES_SHOWN says: as it is
    when it is UTF-8 text of printable characters, else escaped, the whole value the same
    way (a control character is never written to the terminal as it is)."""
    text = value.decode("utf-8", errors="surrogateescape")
    if text.isprintable():
        return text
    shown = []
    for char in text:
        code = ord(char)
        if code in _NOT_UTF8:
            shown.append(f"\\x{code - 0xDC00:02x}")
        elif char in _SHORT_ESCAPES:
            shown.append(_SHORT_ESCAPES[char])
        elif char.isprintable():
            shown.append(char)
        elif code < 0x80:
            shown.append(f"\\x{code:02x}")
        else:  # \xHH would read as a byte: a character says \u or \U
            shown.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return "".join(shown)


def show_key(key: bytes | str) -> str:
    """A key for a log line: as text, escaped only where it is not printable."""
    return show_value(key.encode() if isinstance(key, str) else key)
