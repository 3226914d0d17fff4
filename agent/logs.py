"""Logging for operators: one line per event, naming what it is about.

What a line is about is a set of fields: ``line``, ``device``, ``instance``, ``role`` and
``token``. They live in a context variable, so that two agents in one process
(`agent --simulate --pair`) each log their own; `set_context` sets some of them for the current
task and the tasks it starts, and one record can add or override one with
``log.info(..., extra={"device": "t07"})``.

Where lines go:

- Under systemd, when stderr is connected to the journal (``$JOURNAL_STREAM`` names it), each
  record is sent with the journal's native protocol: MESSAGE, PRIORITY (so that
  ``journalctl -p warning`` works), the fields as LINE=, DEVICE=, INSTANCE=, ROLE=, TOKEN=
  (only those set; ``journalctl -u agent@line1 DEVICE=floor3-t07``), CODE_FILE, CODE_LINE,
  CODE_FUNC, LOGGER and SYSLOG_IDENTIFIER. If the journal's socket cannot take a record, it
  goes to stderr with a ``<N>`` priority prefix instead (systemd's SyslogLevelPrefix=), so
  nothing blocks and nothing is lost.
- Elsewhere, text on stderr: ``time LEVEL [line/device instance] logger: message``.
"""

from __future__ import annotations

import array
import contextvars
import errno
import fcntl
import logging
import os
import socket
import stat
import struct
import sys
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Final, TextIO

# Context fields and their journal field names, in the order the text shows them.
FIELDS: Final = ("line", "device", "instance", "role", "token")
JOURNAL_SOCKET: Final = "/run/systemd/journal/socket"
SYSLOG_IDENTIFIER: Final = "agent"

_EMPTY: Mapping[str, str] = MappingProxyType({})
_context: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "agent_log_context", default=_EMPTY
)


class _Keep:
    """Marks a field that set_context leaves as it is."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = _Keep()


def set_context(
    device: object = KEEP,
    instance: object = KEEP,
    *,
    line: object = KEEP,
    role: object = KEEP,
    token: object = KEEP,
) -> None:
    """Sets fields named in every line logged from this task and the tasks it starts.

    Fields not given keep their value; None removes one. Values are shown with str().
    ``set_context(device, instance)`` (positional) is the single-device form.
    """
    given = {"line": line, "device": device, "instance": instance, "role": role, "token": token}
    fields = dict(_context.get())
    for name, value in given.items():
        if isinstance(value, _Keep):
            continue
        if value is None or value == "":
            fields.pop(name, None)
        else:
            fields[name] = str(value)
    _context.set(MappingProxyType(fields))


_live: contextvars.ContextVar[Callable[[], Mapping[str, str | None]] | None] = (
    contextvars.ContextVar("agent_log_live", default=None)
)


def set_live_fields(fields: Callable[[], Mapping[str, str | None]] | None) -> None:
    """Fields read afresh for every line (an instance's role and token, which change
    while its tasks run); the task's context and a record's own fields go before them."""
    _live.set(fields)


def clear_context() -> None:
    """Removes every field (for this task and the tasks it starts from now on)."""
    _context.set(_EMPTY)


def context() -> dict[str, str]:
    """The fields set for the current task."""
    return dict(_context.get())


def record_fields(record: logging.LogRecord) -> dict[str, str]:
    """The fields of one record: the task's context, then the record's own (extra=)."""
    fields = dict(_context.get())
    live = _live.get()
    if live is not None:
        for name, value in live().items():
            if value is not None and value != "":
                fields[name] = value
    for name in FIELDS:
        value = record.__dict__.get(name)
        if value is not None and value != "":
            fields[name] = str(value)
    return fields


def where(fields: Mapping[str, str]) -> str:
    """``line/device instance``: a device is shown once when it is its own line."""
    place = [fields[name] for name in ("line", "device") if name in fields]
    if len(place) == 2 and place[0] == place[1]:
        place = place[:1]
    words = ["/".join(place)] if place else []
    if "instance" in fields:
        words.append(fields["instance"])
    return " ".join(words) or "-"


def syslog_priority(levelno: int) -> int:
    """The syslog priority (0 emerg .. 7 debug) of a logging level."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


# --------------------------------------------------------------------------- formatting


class TextFormatter(logging.Formatter):
    """``[time ]LEVEL [line/device instance] logger: message`` for a terminal or a file."""

    def __init__(self, *, with_time: bool = True) -> None:
        super().__init__("%(asctime)s " if with_time else "")
        self._with_time = with_time

    def format(self, record: logging.LogRecord) -> str:
        text = (
            f"{record.levelname} [{where(record_fields(record))}] "
            f"{record.name}: {record.getMessage()}"
        )
        if self._with_time:
            text = f"{self.formatTime(record)} {text}"
        return _with_exception(self, record, text)


class JournalFormatter(logging.Formatter):
    """The MESSAGE of a journal entry: ``[line/device instance] message`` (the journal keeps
    time, priority, process and the logger name itself)."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"[{where(record_fields(record))}] {record.getMessage()}"
        return _with_exception(self, record, text)


def _with_exception(formatter: logging.Formatter, record: logging.LogRecord, text: str) -> str:
    if record.exc_info and not record.exc_text:
        record.exc_text = formatter.formatException(record.exc_info)
    if record.exc_text:
        text = f"{text}\n{record.exc_text}"
    if record.stack_info:
        text = f"{text}\n{formatter.formatStack(record.stack_info)}"
    return text


# --------------------------------------------------------------------------- the journal


def journal_fields(record: logging.LogRecord, message: str) -> list[tuple[str, str]]:
    """The fields of the journal entry for one record."""
    fields = [
        ("MESSAGE", message),
        ("PRIORITY", str(syslog_priority(record.levelno))),
        ("SYSLOG_IDENTIFIER", SYSLOG_IDENTIFIER),
        ("LOGGER", record.name),
        ("CODE_FILE", record.pathname),
        ("CODE_LINE", str(record.lineno)),
        ("CODE_FUNC", record.funcName),
    ]
    context = record_fields(record)
    fields.extend((name.upper(), context[name]) for name in FIELDS if name in context)
    return fields


def encode_journal_entry(fields: Iterable[tuple[str, str]]) -> bytes:
    """The native journal protocol: ``NAME=value\\n``, or for a value with a newline
    ``NAME\\n`` + its length (64-bit little endian) + the value + ``\\n``."""
    out = bytearray()
    for name, value in fields:
        data = value.encode("utf-8", errors="replace")
        if b"\n" in data:
            out += name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name.encode() + b"=" + data + b"\n"
    return bytes(out)


class JournalSocket:
    """Datagrams to journald's socket, never blocking: a send that cannot be done at once
    raises OSError, and the caller falls back to stderr."""

    _SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        self.path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._socket.setblocking(False)

    def send(self, entry: bytes) -> None:
        # Not connected: sendto finds journald again after it restarts.
        try:
            self._socket.sendto(entry, self.path)
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):  # too big for a datagram
                raise
            self._send_large(entry)

    def _send_large(self, entry: bytes) -> None:
        """An entry larger than a datagram goes in a sealed memfd (as sd_journal_send does)."""
        fd = os.memfd_create("journal-entry", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(entry)
            while view:
                view = view[os.write(fd, view) :]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, self._SEALS)
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())]
            self._socket.sendmsg([b""], rights, 0, self.path)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._socket.close()


class JournalHandler(logging.Handler):
    """Sends records to the journal; a record the journal does not take goes to `fallback`
    (stderr, which is the journal's stream) with a ``<N>`` priority prefix on every line."""

    def __init__(
        self, journal: JournalSocket | None = None, fallback: TextIO | None = None
    ) -> None:
        super().__init__()
        self.journal = journal or JournalSocket()
        self.fallback = fallback
        self.setFormatter(JournalFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            entry = encode_journal_entry(journal_fields(record, message))
        except Exception:
            self.handleError(record)
            return
        try:
            self.journal.send(entry)
        except OSError:
            self._to_fallback(record, message)

    def _to_fallback(self, record: logging.LogRecord, message: str) -> None:
        stream = self.fallback if self.fallback is not None else sys.stderr
        try:
            stream.write(prefixed(syslog_priority(record.levelno), message))
            stream.flush()
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        try:
            self.journal.close()
        finally:
            super().close()


def prefixed(priority: int, text: str) -> str:
    """Every line with the ``<N>`` prefix that journald reads from a service's stderr."""
    return "".join(f"<{priority}>{line}\n" for line in text.splitlines() or [""])


class PrefixHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr connected to the journal, without the native protocol: ``<N>`` prefixes."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.setFormatter(JournalFormatter())

    def format(self, record: logging.LogRecord) -> str:
        return prefixed(syslog_priority(record.levelno), super().format(record)).rstrip("\n")


def stderr_is_journal(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Whether `stream` is the journal stream systemd connected ($JOURNAL_STREAM=dev:ino)."""
    value = environ.get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    try:
        info = os.fstat(stream.fileno())
        return (info.st_dev, info.st_ino) == (int(device), int(inode))
    except (ValueError, OSError, AttributeError):
        return False


def journal_usable(path: str) -> bool:
    """Whether journald's socket is there (a send can still fail: then stderr is used)."""
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


# --------------------------------------------------------------------------- set-up


def make_handler(
    *,
    stream: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
    journal_socket: str = JOURNAL_SOCKET,
) -> logging.Handler:
    """The handler for this process: the journal, `<N>` lines for it, or text."""
    stream = stream if stream is not None else sys.stderr
    env = os.environ if environ is None else environ
    if stderr_is_journal(stream, env):
        if journal_usable(journal_socket):
            return JournalHandler(JournalSocket(journal_socket), fallback=stream)
        return PrefixHandler(stream)
    handler = logging.StreamHandler(stream)
    # Under systemd (without the journal on stderr) the log's reader usually stamps lines.
    handler.setFormatter(TextFormatter(with_time="INVOCATION_ID" not in env))
    return handler


def setup(
    level: str | None = None,
    *,
    stream: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
    journal_socket: str = JOURNAL_SOCKET,
) -> logging.Handler:
    """Configures the root logger; returns its handler."""
    env = os.environ if environ is None else environ
    level_name = (level or env.get("AGENT_LOG_LEVEL") or "INFO").upper()
    handler = make_handler(stream=stream, environ=env, journal_socket=journal_socket)
    logging.basicConfig(level=level_name, handlers=[handler], force=True)
    # Library chatter (gmqtt logs every packet at INFO) is not an operator's event.
    for noisy in ("gmqtt", "pymodbus"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    return handler


def console_error(
    text: str, *, stream: TextIO | None = None, environ: Mapping[str, str] | None = None
) -> None:
    """A message for whoever started the command, before logging is set up (an invalid
    setting): plain on a terminal, at error priority when stderr is the journal."""
    stream = stream if stream is not None else sys.stderr
    env = os.environ if environ is None else environ
    if stderr_is_journal(stream, env):
        text = prefixed(3, text).rstrip("\n")
    print(text, file=stream, flush=True)
