"""agent/logs.py: the context fields, the text format, and the journal's native protocol over a
real datagram socket standing in for journald (and its fallback to ``<N>`` lines on stderr)."""

from __future__ import annotations

import array
import asyncio
import io
import logging
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import logs


@pytest.fixture(autouse=True)
def fresh_context() -> Iterator[None]:
    logs.clear_context()
    yield
    logs.clear_context()


def record(level: int = logging.INFO, msg: str = "hello", **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("agent.test", level, __file__, 42, msg, None, None, func="probe")
    rec.__dict__.update(extra)
    return rec


# --------------------------------------------------------------------------- the context


def test_set_context_positional_form_of_a_single_device() -> None:
    logs.set_context("thermostat-1", "gw1")
    assert logs.context() == {"device": "thermostat-1", "instance": "gw1"}
    assert logs.where(logs.context()) == "thermostat-1 gw1"


def test_set_context_keywords_update_only_what_they_name() -> None:
    logs.set_context(line="line1", instance="gw1")
    logs.set_context(device="floor3-t07", role="active", token=7)
    assert logs.context() == {
        "line": "line1",
        "instance": "gw1",
        "device": "floor3-t07",
        "role": "active",
        "token": "7",
    }
    logs.set_context(role=None, device="")  # None and "" remove a field
    assert logs.context() == {"line": "line1", "instance": "gw1", "token": "7"}
    with pytest.raises(TypeError):
        logs.set_context("a", "b", "c")  # type: ignore[misc]


def test_where_shows_line_device_and_instance() -> None:
    assert logs.where({}) == "-"
    assert logs.where({"line": "line1", "device": "t07", "instance": "gw1"}) == "line1/t07 gw1"
    assert logs.where({"line": "t1", "device": "t1", "instance": "gw1"}) == "t1 gw1"
    assert logs.where({"device": "t07"}) == "t07"
    assert logs.where({"instance": "gw1", "role": "active"}) == "gw1"


def test_a_record_adds_or_overrides_a_field() -> None:
    logs.set_context(line="line1", device="t01", instance="gw1")
    fields = logs.record_fields(record(device="t07", token=None))
    assert fields == {"line": "line1", "device": "t07", "instance": "gw1"}
    assert logs.context()["device"] == "t01"  # the context itself is unchanged


async def test_two_agents_in_one_process_each_log_their_own_fields() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("agent.test.two")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.TextFormatter(with_time=False))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    both_set = asyncio.Barrier(2)

    async def agent(instance: str) -> None:
        logs.set_context("thermostat-1", instance)
        await both_set.wait()  # the other task has set its own context meanwhile
        logger.info("became %s", "active" if instance == "a" else "standby")

    try:
        await asyncio.gather(agent("a"), agent("b"))
    finally:
        logger.removeHandler(handler)
    lines = sorted(stream.getvalue().splitlines())
    assert lines == [
        "INFO [thermostat-1 a] agent.test.two: became active",
        "INFO [thermostat-1 b] agent.test.two: became standby",
    ]
    assert logs.context() == {}  # the tasks' contexts did not leak into the caller's


def test_text_format_with_time_and_exception() -> None:
    logs.set_context(line="line1", device="t07", instance="gw1")
    try:
        raise ValueError("boom")
    except ValueError:
        rec = record(logging.ERROR, "failed")
        rec.exc_info = __import__("sys").exc_info()
    text = logs.TextFormatter().format(rec)
    first, *rest = text.splitlines()
    assert first.endswith(" ERROR [line1/t07 gw1] agent.test: failed")
    assert first[:4].isdigit()  # the time comes first
    assert rest[-1] == "ValueError: boom"


def test_syslog_priorities() -> None:
    assert [
        logs.syslog_priority(level)
        for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, 50)
    ] == [7, 6, 4, 3, 2]


# --------------------------------------------------------------------------- the journal


def parse_entry(data: bytes) -> dict[str, str]:
    """The native journal protocol, read as journald reads it."""
    fields: dict[str, str] = {}
    i = 0
    while i < len(data):
        end = data.index(b"\n", i)
        line = data[i:end]
        if b"=" in line:
            name, _, value = line.partition(b"=")
            i = end + 1
        else:
            name = line
            (size,) = struct.unpack("<Q", data[end + 1 : end + 9])
            value = data[end + 9 : end + 9 + size]
            assert data[end + 9 + size : end + 10 + size] == b"\n"
            i = end + 10 + size
        assert name.decode() not in fields, name
        fields[name.decode()] = value.decode()
    return fields


class FakeJournald:
    """A datagram socket where journald's would be; reads entries and memfds as it does."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(str(path))

    def receive(self, timeout: float = 5.0) -> dict[str, str]:
        self.socket.settimeout(timeout)
        fds = array.array("i")
        data, ancillary, _, _ = self.socket.recvmsg(1 << 20, socket.CMSG_LEN(fds.itemsize))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        if fds:
            (fd,) = fds
            with os.fdopen(fd, "rb") as memfd:
                assert data == b""
                memfd.seek(0)  # journald maps it from the start
                data = memfd.read()
        return parse_entry(data)

    def close(self) -> None:
        self.socket.close()


@pytest.fixture
def journald(tmp_path: Path) -> Iterator[FakeJournald]:
    server = FakeJournald(tmp_path / "journal.socket")
    yield server
    server.close()


def journal_logger(
    journald: FakeJournald, fallback: io.StringIO
) -> tuple[logging.Logger, logs.JournalHandler]:
    handler = logs.JournalHandler(logs.JournalSocket(str(journald.path)), fallback=fallback)
    logger = logging.getLogger(f"agent.test.journal.{id(handler)}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return logger, handler


def test_journal_entry_has_priority_fields_and_code_location(journald: FakeJournald) -> None:
    fallback = io.StringIO()
    logger, handler = journal_logger(journald, fallback)
    logs.set_context(line="line1", instance="gw1", role="active", token="0017:00002")
    logger.warning("controller %s unavailable", "t07", extra={"device": "floor3-t07"})
    entry = journald.receive()
    handler.close()
    assert entry["MESSAGE"] == "[line1/floor3-t07 gw1] controller t07 unavailable"
    assert entry["PRIORITY"] == "4"
    assert entry["SYSLOG_IDENTIFIER"] == "agent"
    assert entry["LOGGER"] == logger.name
    assert entry["LINE"] == "line1"
    assert entry["DEVICE"] == "floor3-t07"
    assert entry["INSTANCE"] == "gw1"
    assert entry["ROLE"] == "active"
    assert entry["TOKEN"] == "0017:00002"
    assert entry["CODE_FILE"] == __file__
    assert entry["CODE_FUNC"] == "test_journal_entry_has_priority_fields_and_code_location"
    assert int(entry["CODE_LINE"]) > 0
    assert fallback.getvalue() == ""


def test_journal_entry_carries_only_the_fields_that_are_set(journald: FakeJournald) -> None:
    logger, handler = journal_logger(journald, io.StringIO())
    logs.set_context("thermostat-1", "gw2")
    logger.info("started as standby")
    logger.error("refused")
    info, error = journald.receive(), journald.receive()
    handler.close()
    assert info["PRIORITY"] == "6" and error["PRIORITY"] == "3"
    assert info["DEVICE"] == "thermostat-1" and info["INSTANCE"] == "gw2"
    assert not {"LINE", "ROLE", "TOKEN"} & set(info)


def test_multiline_and_large_entries(journald: FakeJournald) -> None:
    logger, handler = journal_logger(journald, io.StringIO())
    try:
        raise RuntimeError("first line\nsecond line")
    except RuntimeError:
        logger.exception("background task failed")
    entry = journald.receive()
    assert entry["MESSAGE"].startswith("[-] background task failed\nTraceback")
    assert entry["MESSAGE"].endswith("RuntimeError: first line\nsecond line")
    assert entry["PRIORITY"] == "3"

    # Larger than a datagram may be: sent in a sealed memfd, as sd_journal_send does.
    big = "x" * 600_000
    logger.info("%s", big)
    entry = journald.receive()
    handler.close()
    assert entry["MESSAGE"] == f"[-] {big}"


def test_without_journald_records_go_to_stderr_with_priority_prefixes(tmp_path: Path) -> None:
    fallback = io.StringIO()
    handler = logs.JournalHandler(
        logs.JournalSocket(str(tmp_path / "no-journald")), fallback=fallback
    )
    logger = logging.getLogger("agent.test.nojournal")
    logger.propagate = False
    logger.addHandler(handler)
    logs.set_context("t1", "gw1")
    logger.warning("one\ntwo")
    logger.error("three")
    handler.close()
    assert fallback.getvalue() == "<4>[t1 gw1] one\n<4>two\n<3>[t1 gw1] three\n"


def test_a_journal_that_does_not_read_never_blocks_the_logger(journald: FakeJournald) -> None:
    fallback = io.StringIO()
    logger, handler = journal_logger(journald, fallback)
    started = time.monotonic()
    for number in range(3000):
        logger.info("line %d", number)
    elapsed = time.monotonic() - started
    handler.close()
    # The socket's queue filled up: the rest went to stderr at once instead of waiting.
    assert "<6>[-] line 2999\n" in fallback.getvalue()
    assert elapsed < 10, elapsed


# --------------------------------------------------------------------------- set-up


def journal_stream_of(path: Path) -> tuple[io.TextIOWrapper, dict[str, str]]:
    stream = path.open("w")
    info = os.fstat(stream.fileno())
    return stream, {"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}", "INVOCATION_ID": "x"}


def test_setup_uses_the_journal_when_stderr_is_its_stream(
    tmp_path: Path, journald: FakeJournald
) -> None:
    stream, environ = journal_stream_of(tmp_path / "stderr")
    with stream:
        handler = logs.setup(
            "INFO", stream=stream, environ=environ, journal_socket=str(journald.path)
        )
        try:
            assert isinstance(handler, logs.JournalHandler)
            logging.getLogger("agent").warning("to the journal")
            assert journald.receive()["MESSAGE"] == "[-] to the journal"
        finally:
            logs.setup("INFO")


def test_setup_falls_back_to_prefixes_without_the_socket(tmp_path: Path) -> None:
    stream, environ = journal_stream_of(tmp_path / "stderr")
    with stream:
        handler = logs.setup(
            "INFO", stream=stream, environ=environ, journal_socket=str(tmp_path / "none")
        )
        try:
            assert isinstance(handler, logs.PrefixHandler)
            logs.set_context("t1", "gw1")
            logging.getLogger("agent").warning("no socket")
            logging.getLogger("agent").debug("not shown at INFO")
        finally:
            logs.setup("INFO")
    assert (tmp_path / "stderr").read_text() == "<4>[t1 gw1] no socket\n"


def test_setup_writes_text_on_a_terminal(tmp_path: Path, journald: FakeJournald) -> None:
    stream, environ = journal_stream_of(tmp_path / "stderr")
    other = (tmp_path / "other").open("w")
    with stream, other:
        # JOURNAL_STREAM names another file: this stderr is not the journal.
        handler = logs.setup(
            "INFO", stream=other, environ=environ, journal_socket=str(journald.path)
        )
        try:
            assert type(handler) is logging.StreamHandler
            logs.set_context("t1", "gw1")
            logging.getLogger("agent").info("plain")
        finally:
            logs.setup("INFO")
    assert (tmp_path / "other").read_text() == "INFO [t1 gw1] agent: plain\n"


def test_console_error_is_plain_on_a_terminal_and_an_error_in_the_journal(
    tmp_path: Path,
) -> None:
    terminal = io.StringIO()
    logs.console_error("agent: invalid setting X", stream=terminal, environ={})
    assert terminal.getvalue() == "agent: invalid setting X\n"
    stream, environ = journal_stream_of(tmp_path / "stderr")
    with stream:
        logs.console_error("agent: invalid setting X", stream=stream, environ=environ)
    assert (tmp_path / "stderr").read_text() == "<3>agent: invalid setting X\n"
