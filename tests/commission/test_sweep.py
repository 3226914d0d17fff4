"""The sweep's decisions, driven by a model line in plain code: what it sends next, how it
hears replies, what it finds, and what the line's floor is."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.commission import devices_file
from agent.commission.sweep import (
    PRESENCE_ATTEMPTS,
    Heard,
    Probe,
    Protocol,
    Settings,
    Step,
    Sweep,
    hear,
    judge,
    others_before,
    reply_complete,
)
from agent.config.profiles import read_devices_file
from agent.controller import line_protocol as lp
from agent.controller import modbus_ident as ident
from agent.controller import modbus_rtu as rtu
from agent.controller.interface import DeviceIdentity
from agent.controller.modbus_map import RegisterMap
from agent.controller.sim_profile import SIM
from agent.simulator.core import DeviceCore, collide, parse_text_request
from agent.simulator.rtu import RegisterView, parse_rtu_request

Line = Callable[[Probe], bytes]


def model_line(
    protocol: Protocol, units: set[int], doubled: set[int] = frozenset(), refuse_id: bool = False
) -> Line:
    """What a line of the fake's units sends back to each probe: the fake's own replies
    (its cores), two at once colliding where `doubled`."""
    cores = {
        a: DeviceCore(now=0.0, identity=DeviceIdentity("SIM-TSTAT", "1.0.0", f"SIM{a:04d}"))
        for a in units
    }
    doubles = {
        a: DeviceCore(now=0.0, identity=DeviceIdentity("SIM-TSTAT", "1.0.0", f"SIM{a + 5000:04d}"))
        for a in doubled
    }

    def reply(core: DeviceCore, probe: Probe) -> bytes:
        if protocol == "line":
            request = parse_text_request(probe.frame.rstrip(b"\r\n"), SIM.line)  # type: ignore[arg-type]
            assert request is not None
            return core.answer_text(request, 0.0, "pty")
        if refuse_id and probe.frame[1] in (ident.ENCAPSULATED, ident.REPORT_SERVER_ID):
            return rtu.frame(bytes((probe.frame[0], probe.frame[1] | 0x80, 1)))
        return RegisterView(RegisterMap(), core).answer(parse_rtu_request(probe.frame), 0.0, "pty")

    def line(probe: Probe) -> bytes:
        core = cores.get(probe.address)
        if core is None:
            return b""
        first = reply(core, probe)
        double = doubles.get(probe.address)
        return first if double is None else collide(first, reply(double, probe))

    return line


def run(sweep: Sweep, line: Line) -> list[Probe]:
    sent: list[Probe] = []
    while (probe := sweep.next_probe()) is not None:
        sent.append(probe)
        sweep.record(probe, line(probe), 0.01)
    return sent


addresses = st.sets(st.integers(1, 247), max_size=12)


@given(
    protocol=st.sampled_from(["line", "modbus"]),
    units=addresses,
    doubled=addresses,
    span=st.tuples(st.integers(1, 247), st.integers(0, 60)),
)
def test_a_sweep_finds_each_unit_and_each_collision_and_a_dead_address_costs_one_probe(
    protocol: Protocol, units: set[int], doubled: set[int], span: tuple[int, int]
) -> None:
    doubled &= units
    scanned = list(range(span[0], min(247, span[0] + span[1]) + 1))
    sweep = Sweep(protocol, scanned, Settings(9600), SIM)
    sent = run(sweep, model_line(protocol, units, doubled))
    result = sweep.result
    in_range = {a for a in units if a in scanned}
    assert [f.address for f in result.found] == sorted(in_range - doubled)
    assert result.collisions == sorted(doubled & in_range)
    for found in result.found:
        assert found.points == list(SIM.points) and not found.missing
        assert found.identity is not None and f"SIM{found.address:04d}" in found.identity
    dead = [p for p in sent if p.address not in units]
    assert len(dead) == len(set(scanned) - units)  # one probe each, no retry
    collided = [p for p in sent if p.address in doubled & in_range]
    assert len(collided) == PRESENCE_ATTEMPTS * len(doubled & in_range)
    assert result.probes == len(sent)


def test_the_floor_is_every_transactions_line_time() -> None:
    settings = Settings(9600)
    sweep = Sweep("line", [1, 2], settings)
    line = model_line("line", {2})
    sent = run(sweep, line)
    assert [(p.address, p.step) for p in sent] == [
        (1, Step.PRESENCE),
        (2, Step.PRESENCE),
        (2, Step.DEVICE_ID),
        (2, Step.POINTS),
    ]
    assert [p.frame for p in sent[1:]] == [
        lp.encode_line("@2 GET SP"),
        lp.encode_line("@2 ID"),
        lp.encode_line("@2 GET STATE"),
    ]
    timing = settings.timing()
    expected = sum(timing.transaction_s(len(p.frame), len(line(p))) for p in sent)
    assert sweep.result.floor_s == pytest.approx(expected)
    assert sweep.result.found[0].points == ["setPoint", "temperature"]
    assert sweep.result.found[0].identity == "SIM-TSTAT 1.0.0 SIM0002"


def test_a_modbus_unit_that_answers_no_identification_still_counts() -> None:
    sweep = Sweep("modbus", [5], Settings(19200, "E"), SIM)
    sent = run(sweep, model_line("modbus", {5}, refuse_id=True))
    assert [p.step for p in sent][:3] == [Step.PRESENCE, Step.DEVICE_ID, Step.SERVER_ID]
    (found,) = sweep.result.found
    assert found.identity is None and found.points == list(SIM.points)


def test_a_block_read_refused_is_asked_register_by_register() -> None:
    sweep = Sweep("modbus", [4], Settings(19200), SIM)

    def line(probe: Probe) -> bytes:
        if probe.step is Step.POINTS:
            return rtu.frame(bytes((4, 0x83, 2)))  # a block: illegal address
        if probe.step is Step.READ_ONE and probe.registers[0][0] == "humidity":
            return rtu.frame(bytes((4, 0x83, 2)))
        return model_line("modbus", {4})(probe)

    sent = run(sweep, line)
    assert sum(p.step is Step.READ_ONE for p in sent) == len(SIM.points)
    (found,) = sweep.result.found
    assert found.missing == ["humidity"]
    assert found.points == [p for p in SIM.points if p != "humidity"]


@given(
    protocol=st.sampled_from(["line", "modbus"]),
    units=st.sets(st.integers(1, 20), min_size=1, max_size=8),
    slow=st.data(),
)
def test_a_reply_after_its_timeout_has_its_address_asked_again_at_the_end(
    protocol: Protocol, units: set[int], slow: st.DataObject
) -> None:
    """A line of slow units: each reply of the `late` units comes only after the reply
    window closed, before the next request (or, `later`, in the next reply window), unless
    the probe waits patiently. The sweep still finds every unit, whole."""
    late = slow.draw(st.sets(st.sampled_from(sorted(units))))
    later = slow.draw(st.booleans())
    sweep = Sweep(protocol, list(range(1, 21)), Settings(9600), SIM)
    line = model_line(protocol, units)
    owed = b""
    while True:
        probe = sweep.next_probe()
        if probe is None:  # a last look, for the last address's reply
            if not sweep.heard_late(owed):
                break
            owed = b""
            continue
        if not later:
            sweep.heard_late(owed)  # heard before the next request
            owed = b""
        reply = line(probe)
        if probe.address in late and not probe.patient:
            owed, reply = owed + reply, b""
        else:
            owed, reply = b"", owed + reply  # heard in the next reply window
        sweep.record(probe, reply, 0.01)
    result = sweep.result
    assert [f.address for f in result.found] == sorted(units)
    assert all(not f.missing for f in result.found)
    assert sorted(result.late) == sorted(late)
    assert not result.collisions


@given(
    protocol=st.sampled_from(["line", "modbus"]),
    others=st.lists(st.integers(1, 20), max_size=3),
    address=st.integers(21, 30),
    answered=st.booleans(),
)
def test_other_addresses_late_replies_before_a_probes_own_are_set_aside(
    protocol: Protocol, others: list[int], address: int, answered: bool
) -> None:
    """Behind a slow unit, replies to earlier probes of other addresses come in a probe's
    window before its own: taken for its reply, they put the sweep out of step (each
    follow-up heard the previous request's reply). They are set aside, the own reply heard,
    and their addresses, unanswered before, asked again."""
    line = model_line(protocol, {*others, address})
    stale = b"".join(line(Sweep(protocol, [o], Settings(9600), SIM).presence(o)) for o in others)
    sweep = Sweep(protocol, [*dict.fromkeys(others), address], Settings(9600), SIM)
    for _ in dict.fromkeys(others):  # each unanswered in its own window
        probe = sweep.next_probe()
        assert probe is not None
        sweep.record(probe, b"", 0.06)
    probe = sweep.next_probe()
    assert probe is not None and probe.address == address
    own = line(probe) if answered else b""
    assert others_before(protocol, address, stale + own) == len(stale)
    hearing = sweep.record(probe, stale + own, 0.01)
    assert hearing.heard is (Heard.ANSWER if answered else Heard.SILENT)
    assert sorted(sweep.result.late) == sorted(set(others))


def test_a_unit_found_that_goes_silent_once_is_asked_again() -> None:
    sweep = Sweep("line", [6], Settings(9600), SIM)
    model = model_line("line", {6})
    silent = {Step.POINTS}

    def line(probe: Probe) -> bytes:
        if probe.step in silent:
            silent.discard(probe.step)
            return b""
        return model(probe)

    sent = run(sweep, line)
    assert [p.step for p in sent] == [Step.PRESENCE, Step.DEVICE_ID, Step.POINTS, Step.POINTS]
    (found,) = sweep.result.found
    assert found.points == list(SIM.points) and not found.missing


@given(st.lists(st.sampled_from(list(Heard)), min_size=1, max_size=4))
def test_judge(heard: list[Heard]) -> None:
    verdict = judge(heard)
    if Heard.DOUBLED in heard:
        assert verdict == "collision"
    elif Heard.ANSWER in heard or Heard.REFUSED in heard:
        assert verdict == "present"
    elif all(h is Heard.GARBLED for h in heard):
        assert verdict == ("collision" if len(heard) >= PRESENCE_ATTEMPTS else "again")
    elif Heard.GARBLED in heard:
        assert verdict == "noise"
    else:
        assert verdict == "absent"


def test_garbage_once_then_silence_is_noise_not_a_collision() -> None:
    sweep = Sweep("line", [9], Settings(9600))
    heard = iter([b"\x00\xfe\x13#", b""])
    run(sweep, lambda probe: next(heard))
    assert sweep.result.noisy == [9] and not sweep.result.collisions and not sweep.result.found


@pytest.mark.parametrize(
    ("raw", "heard", "noise"),
    [
        (lp.encode_line("@3 ID A 1 S"), Heard.ANSWER, 0),
        (b"\x00\xff\x13 \r\n" + lp.encode_line("@3 ID A 1 S"), Heard.ANSWER, 5),
        (lp.encode_line("@3 ID A 1 S") + lp.encode_line("@3 ID B 1 S"), Heard.DOUBLED, 0),
        (lp.encode_line("@4 ID A 1 S"), Heard.GARBLED, 0),  # another address's reply
        (lp.encode_line("@3 ERR UNKNOWN"), Heard.REFUSED, 0),
        (b"@3 ID A 1 S*00\r\n", Heard.GARBLED, 0),
        (b"", Heard.SILENT, 0),
    ],
)
def test_hearing_the_line_protocol(raw: bytes, heard: Heard, noise: int) -> None:
    hearing = hear("line", Probe(3, Step.PRESENCE, lp.encode_line("@3 ID")), raw)
    assert (hearing.heard, hearing.noise) == (heard, noise)


def test_hearing_modbus() -> None:
    request = rtu.read_request(3, 3, 0, 1)
    probe = Probe(3, Step.PRESENCE, request)
    good = rtu.frame(bytes((3, 3, 2, 0, 200)))
    assert hear("modbus", probe, good).heard is Heard.ANSWER
    assert hear("modbus", probe, good + good).heard is Heard.DOUBLED
    assert hear("modbus", probe, good[:-1] + b"\x00").heard is Heard.GARBLED
    assert hear("modbus", probe, rtu.frame(bytes((3, 0x83, 2)))).heard is Heard.REFUSED
    assert hear("modbus", probe, good + b"\x00\xff").noise == 2


def test_the_devices_file_loads_as_the_agent_reads_it() -> None:
    text = devices_file.render("floor3", [7, 3], "sim")
    devices, profiles = read_devices_file(text)
    assert devices == [
        {"id": "floor3-003", "address": 3, "profile": "sim"},
        {"id": "floor3-007", "address": 7, "profile": "sim"},
    ]
    assert profiles == {}


def test_a_profile_not_built_in_goes_into_the_devices_file() -> None:
    definition = {
        "protocol": "modbus",
        "points": {
            "setPoint": {"register": 0, "limits": {"min": 5, "max": 35, "step": 0.5}},
            "temperature": {"register": 1, "read": 4},
        },
    }
    devices, profiles = read_devices_file(devices_file.render("floor3", [2], "kc", definition))
    assert devices == [{"id": "floor3-002", "address": 2, "profile": "kc"}]
    assert profiles["kc"].modbus is not None
    assert list(profiles["kc"].points) == ["setPoint", "temperature"]


@given(
    protocol=st.sampled_from(["line", "modbus"]),
    step=st.sampled_from(list(Step)),
    raw=st.binary(max_size=300),
)
def test_any_bytes_are_heard_as_something_never_an_error(
    protocol: Protocol, step: Step, raw: bytes
) -> None:
    frame = lp.encode_line("@3 GET SP") if protocol == "line" else rtu.read_request(3, 3, 0, 1)
    if protocol == "modbus" and step is Step.DEVICE_ID:
        frame = ident.device_id_request(3)
    elif protocol == "modbus" and step is Step.SERVER_ID:
        frame = ident.server_id_request(3)
    probe = Probe(3, step, frame)
    assert hear(protocol, probe, raw).heard in Heard
    assert reply_complete(protocol, probe, raw) in (True, False)
