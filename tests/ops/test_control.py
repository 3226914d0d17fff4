"""The operator's requests, pure: their formats, how an instance follows them (LineControl,
with its clock in the test's hands), the health words and the HTTP status codes."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.client.statestore import KeyChange
from agent.ops.control import InvalidRequest, PauseNote, SwitchoverRequest
from agent.runtime.control import LineControl
from agent.runtime.health import DeviceHealth, in_sync, status_words
from agent.runtime.health_http import status_for

HOLDER = b"gw1#0a1b2c3d"


# --------------------------------------------------------------------------- formats


def test_a_switchover_request_round_trips() -> None:
    request = SwitchoverRequest("gw1#0a1b2c3d", "gw2", "ops@laptop", "2027-01-15T08:00:00Z")
    assert SwitchoverRequest.parse(request.encode()) == request
    anyone = SwitchoverRequest("gw1#0a1b2c3d", None)
    assert SwitchoverRequest.parse(anyone.encode()).to is None


@pytest.mark.parametrize(
    "raw",
    [b"", b"yes", b"[1]", b'{"to":"gw2"}', b'{"holder":""}', b'{"holder":"a","to":3}', b"\xff"],
)
def test_what_is_not_a_switchover_request(raw: bytes) -> None:
    with pytest.raises(InvalidRequest):
        SwitchoverRequest.parse(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_value_is_a_request_or_invalid_never_a_crash(raw: bytes) -> None:
    with contextlib.suppress(InvalidRequest):
        SwitchoverRequest.parse(raw)
    assert isinstance(PauseNote.parse(raw).describe(), str)


def test_a_pause_written_by_hand_is_its_own_reason() -> None:
    assert PauseNote.parse(b"rewiring floor 3").describe() == "rewiring floor 3"
    note = PauseNote("ops@x", "2027-01-15T08:00:00Z", "")
    assert PauseNote.parse(note.encode()) == note
    assert note.describe() == "no reason given, by ops@x, at 2027-01-15T08:00:00Z"
    assert len(PauseNote.parse(b"x" * 10_000).reason) == 200


# --------------------------------------------------------------------------- LineControl


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def control(instance: str, clock: Clock, calls: list[Any]) -> LineControl:
    return LineControl(
        None,  # type: ignore[arg-type]  # the keys' changes are handed over below
        paused_key="floor3\\paused",
        switchover_key="floor3\\switchover",
        instance_id=instance,
        holder=HOLDER if instance == "gw1" else f"{instance}#99".encode(),
        grace_s=3.0,
        on_pause=lambda: calls.append("pause"),
        on_switchover=calls.append,
        monotonic=clock,
    )


def change(key: str, value: bytes | None) -> KeyChange:
    return KeyChange(key.encode(), "SET" if value is not None else "DELETE", value, None)


def test_the_active_named_by_a_request_hands_over_and_stands_aside() -> None:
    clock, calls = Clock(), []
    active = control("gw1", clock, calls)
    request = SwitchoverRequest(HOLDER.decode(), None)
    active._switchover_changed(change("floor3\\switchover", request.encode()))
    assert calls == [request]
    active.stand_aside()
    assert active.hold_off()
    clock.now += 2.9
    assert active.hold_off()
    clock.now += 0.2
    assert not active.hold_off()  # nobody took it: contend again
    # Withdrawn before the grace period ends: at once.
    active.stand_aside()
    active._switchover_changed(change("floor3\\switchover", None))
    assert not active.hold_off()


def test_a_request_for_another_process_is_none_of_its_business() -> None:
    clock, calls = Clock(), []
    active = control("gw1", clock, calls)
    stale = SwitchoverRequest("gw1#ffffffff", None)  # an earlier process of gw1
    active._switchover_changed(change("floor3\\switchover", stale.encode()))
    assert calls == [] and not active.hold_off()


def test_a_standby_holds_off_while_another_is_named() -> None:
    clock, calls = Clock(), []
    named, other = control("gw2", clock, calls), control("gw3", clock, calls)
    request = SwitchoverRequest(HOLDER.decode(), "gw2").encode()
    for standby in (named, other):
        standby._switchover_changed(change("floor3\\switchover", request))
    assert not named.hold_off() and other.hold_off()
    clock.now += 3.1
    assert not other.hold_off()  # the named one did not come: anyone may
    assert calls == []


def test_an_invalid_request_is_ignored() -> None:
    clock, calls = Clock(), []
    active = control("gw1", clock, calls)
    active._switchover_changed(change("floor3\\switchover", b"please"))
    assert calls == [] and active.request is None


def test_pause_and_resume_are_told_once_each() -> None:
    clock, calls = Clock(), []
    instance = control("gw1", clock, calls)
    instance._paused_changed(change("floor3\\paused", PauseNote("a", "", "b").encode()))
    instance._paused_changed(change("floor3\\paused", b"another note"))
    assert instance.paused and instance.pause == PauseNote("", "", "another note")
    instance._paused_changed(change("floor3\\paused", None))
    assert calls == ["pause", "pause"] and not instance.paused


# --------------------------------------------------------------------------- words, codes


def devices(*states: tuple[bool, bool]) -> list[DeviceHealth]:
    return [DeviceHealth(f"t{n:02d}", a, s) for n, (a, s) in enumerate(states, 1)]


@pytest.mark.parametrize(
    ("role", "single", "states", "paused", "words"),
    [
        (
            "active",
            False,
            [(True, True)] * 3,
            False,
            "active for line floor3: 3 devices, 3 in sync",
        ),
        (
            "active",
            False,
            [(True, True), (False, False), (True, False)],
            False,
            "active for line floor3: 3 devices, 1 in sync, 1 syncing (t03), 1 not answering (t02)",
        ),
        (
            "active",
            False,
            [(False, False)] * 5,
            False,
            "active for line floor3: 5 devices, 0 in sync, 5 not answering (t01, t02, t03, +2)",
        ),
        (
            "active",
            False,
            [(True, True)] * 2,
            True,
            "active for line floor3: paused, the line closed (2 devices)",
        ),
        ("standby", False, [(True, True)] * 2, False, "standby for line floor3 (2 devices)"),
        ("standby", False, [(True, True)] * 2, True, "standby for line floor3 (2 devices), paused"),
        ("active", True, [(True, True)], False, "active for floor3: in sync"),
        ("active", True, [(False, False)], False, "active for floor3: not answering"),
        ("active", True, [(True, False)], False, "active for floor3: syncing"),
        ("standby", True, [(True, True)], False, "standby for floor3"),
    ],
)
def test_status_words(
    role: str, single: bool, states: list[tuple[bool, bool]], paused: bool, words: str
) -> None:
    found = status_words(role, "floor3", single=single, devices=devices(*states), paused=paused)
    assert found == words


def test_in_sync_compares_the_store_text_with_the_controller() -> None:
    assert in_sync(b"21.5", 21.5) and in_sync(b"21.50", 21.5)
    assert not in_sync(b"21.5", 21.0) and not in_sync(None, 21.5) and not in_sync(b"hot", 1.0)


@pytest.mark.parametrize(
    ("path", "active", "standby", "paused", "failing"),
    [
        ("/leader", 200, 503, 200, 200),
        ("/", 200, 503, 200, 200),
        ("/replica", 503, 200, 200, 503),
        ("/health", 200, 200, 200, 503),
        ("/paused", 503, 503, 200, 503),
        ("/liveness", 200, 200, 200, 200),
        ("/nope", 404, 404, 404, 404),
    ],
)
def test_http_status_codes(path: str, active: int, standby: int, paused: int, failing: int) -> None:
    assert status_for(path, {"role": "active", "state": "running"}) == active
    assert status_for(path, {"role": "standby", "state": "running"}) == standby
    role = "active" if path in ("/leader", "/") else "standby"
    assert status_for(path, {"role": role, "state": "paused", "paused": True}) == paused
    assert status_for(path, {"role": role, "state": "failing"}) == failing
