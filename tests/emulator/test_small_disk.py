"""`agent emulator --data-dir` on a nearly full disk: a tmpfs of 1 MiB (root only)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.emulator import persistence
from tests.emulator.test_durability import OK, start
from tests.emulator.test_persistence import DISK_ERROR, Clocks, Service
from tests.support.paho_client import PahoStoreClient

VALUE = "v" * 1000
DELETED = b":1\r\n"
ABSENT = b"$-1\r\n"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount / "data"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def write_keys(data: Path, count: int) -> None:
    service = Service(data, Clocks())
    for index in range(count):
        service.request("SET", f"key-{index:04}", VALUE)
    service.stop()


def fill(client: PahoStoreClient, acknowledged: set[str], refused: set[str]) -> None:
    """SETs, many at a time, until 20 are refused."""
    for batch in range(100):
        names = [f"fill-{batch}-{index}" for index in range(20)]
        waiters = [client.send("SET", name, VALUE) for name in names]
        for name, waiter in zip(names, waiters, strict=True):
            answer = waiter.get(timeout=10).payload
            assert answer in (OK, DISK_ERROR), answer
            (acknowledged if answer == OK else refused).add(name)
        if len(refused) >= 20:
            return
    raise AssertionError("SETs went on being acknowledged on a full disk")


def check(client: PahoStoreClient, present: set[str], absent: set[str]) -> None:
    value = f"${len(VALUE)}\r\n{VALUE}\r\n".encode()
    waiters = {name: client.send("GET", name) for name in present | absent}
    for name, waiter in waiters.items():
        assert waiter.get(timeout=10).payload == (value if name in present else ABSENT), name


def test_a_whole_log_starts_on_a_disk_without_room_for_a_copy(small_disk: Path) -> None:
    """Was: exit 78, no space left on device: every start rewrote the whole log first."""
    write_keys(small_disk, 600)
    assert (small_disk / persistence.LOG_NAME).stat().st_size > 600_000
    process, port = start(small_disk)
    client = PahoStoreClient("127.0.0.1", port, "reader")
    try:
        check(client, {"key-0000", "key-0599"}, set())
    finally:
        client.close()
        assert process.stop() == 0


def test_a_full_disk_takes_deletes_and_keeps_all_it_acknowledged(small_disk: Path) -> None:
    """Was: a DEL that would make room was refused, and a clean stop said "the changes
    since the first failure are lost", changes it had acknowledged."""
    write_keys(small_disk, 300)
    acknowledged = {f"key-{index:04}" for index in range(300)}
    refused: set[str] = set()
    process, port = start(small_disk)
    client = PahoStoreClient("127.0.0.1", port, "writer")
    try:
        fill(client, acknowledged, refused)
        for name in ("key-0000", "key-0001", "key-0002"):
            assert client.request("DEL", name).payload == DELETED
            acknowledged.remove(name)
        assert client.request("SET", "one-more", VALUE).payload == DISK_ERROR
        refused.add("one-more")
    finally:
        client.close()
        assert process.stop() == 0
    assert not any("lost" in line for line in process.lines), process.lines
    deleted = {"key-0000", "key-0001", "key-0002"}
    process, port = start(small_disk)  # on the disk still full
    client = PahoStoreClient("127.0.0.1", port, "reader")
    try:
        check(client, acknowledged, refused | deleted)
    finally:
        client.close()
        assert process.stop() == 0


def test_sets_are_accepted_again_once_the_disk_has_room(small_disk: Path) -> None:
    small_disk.mkdir()
    filler = small_disk.parent / "filler"
    filler.write_bytes(bytes(600_000))
    acknowledged: set[str] = set()
    refused: set[str] = set()
    process, port = start(small_disk)
    client = PahoStoreClient("127.0.0.1", port, "writer")
    try:
        fill(client, acknowledged, refused)
        filler.unlink()
        deadline = time.monotonic() + 5
        while client.request("SET", "after", VALUE).payload != OK:
            assert time.monotonic() < deadline, "SETs were not accepted again"
        acknowledged.add("after")
        check(client, acknowledged, refused)
    finally:
        client.close()
        assert process.stop() == 0
