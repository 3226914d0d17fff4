"""The bus schedule, directly and as a simulated line (hypothesis drives the devices)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.controller.timing import TYPICAL_TURNAROUND_S, LineTiming, bits_per_char, cycle_s
from agent.line.schedule import (
    URGENT_BEFORE_ROUTINE,
    BusSchedule,
    Change,
    Kind,
    Op,
    Outcome,
    Refused,
    Verdict,
)
from tests.support.examples import examples

DEVICES = ["t1", "t2", "t3"]


def schedule(**options: object) -> BusSchedule:
    values: dict[str, object] = {"poll_interval_s": 1.0, "min_write_interval_s": 1.0}
    values.update(options)
    return BusSchedule(DEVICES, **values)  # type: ignore[arg-type]


def test_a_cycle_reads_every_device_once_then_waits_for_the_next() -> None:
    s = schedule()
    ops = [s.next(0.0) for _ in DEVICES]
    assert [(op.device, op.kind) for op in ops] == [(d, Kind.POLL) for d in DEVICES]  # type: ignore[union-attr]
    for op in ops:
        assert s.finished(op, Outcome.OK, 0.1) == Verdict()  # type: ignore[arg-type]
    assert s.next(0.3) == 1.0  # the next cycle is due one interval after this one started
    assert s.last_cycle_s == pytest.approx(0.3)
    assert isinstance(s.next(1.0), Op)


def test_urgent_work_jumps_the_queue_of_polls() -> None:
    s = schedule()
    first = s.next(0.0)
    assert isinstance(first, Op) and first.kind is Kind.POLL
    read = Op("t3", Kind.READ)
    s.submit(read)
    assert s.next(0.1) is read


def test_under_a_stream_of_remote_changes_polls_and_probes_still_get_a_turn() -> None:
    """The soak's D8: with a remote change always waiting, no unit was polled (panel
    changes unseen) and no quarantined unit probed for minutes. A due probe or poll takes
    a turn after URGENT_BEFORE_ROUTINE urgent transactions, never between a read and its
    write."""
    s = BusSchedule([*DEVICES, "t4"], poll_interval_s=0.5, write_hold_s=0.05, probe_initial_s=1.0)
    s.finished(Op("t4", Kind.POLL), Outcome.TIMEOUT, 0.0)
    s.finished(Op("t4", Kind.POLL), Outcome.TIMEOUT, 0.0)
    assert s.quarantined("t4")
    now, change = 0.0, itertools.count()
    ops: list[tuple[float, Op]] = []
    while now < 10.0:
        # A remote change always waiting: each is read, then written.
        if not s.pending():
            device = DEVICES[next(change) % len(DEVICES)]
            s.submit(Op(device, Kind.READ))
        op = s.next(now)
        assert isinstance(op, Op), op
        ops.append((now, op))
        now += 0.01
        s.finished(op, Outcome.OK, now)
        if op.kind is Kind.READ:
            s.submit(Op(op.device, Kind.WRITE, 21.0))
    # Each device polled every poll interval still, give or take a few turns' wait.
    kinds = [op.kind for _, op in ops]
    assert kinds.count(Kind.PROBE) >= 1
    for device in DEVICES:
        times = [t for t, op in ops if op.kind is Kind.POLL and op.device == device]
        assert times and max(b - a for a, b in itertools.pairwise([0.0, *times, now])) <= (
            0.5 + 3 * (URGENT_BEFORE_ROUTINE + 1) * 0.01
        ), (device, times)
    for earlier, later in itertools.pairwise(kinds):
        assert not (earlier is Kind.READ and later in (Kind.POLL, Kind.PROBE)), kinds
    # Most of the line still serves the remote changes.
    assert kinds.count(Kind.READ) > len(kinds) / 3


def test_pending_writes_to_one_device_collapse_to_the_latest() -> None:
    s = schedule()
    first, second, other = (
        Op("t1", Kind.WRITE, 20.0),
        Op("t1", Kind.WRITE, 21.0),
        Op("t2", Kind.WRITE, 5),
    )
    assert s.submit(first) is None
    assert s.submit(other) is None
    assert s.submit(second) is first  # superseded: its caller is told
    assert s.next(0.0) is second
    assert s.next(0.0) is other


def test_after_an_urgent_read_polls_wait_for_the_write_that_may_follow() -> None:
    s = schedule(write_hold_s=0.03, poll_interval_s=0.001)
    s.submit(Op("t1", Kind.READ))
    read = s.next(0.0)
    assert isinstance(read, Op) and read.kind is Kind.READ
    s.finished(read, Outcome.OK, 0.015)
    assert s.next(0.02) == pytest.approx(0.045)  # no poll before the hold ends
    s.submit(Op("t1", Kind.WRITE, 21.0))
    write = s.next(0.025)  # urgent work is never held
    assert isinstance(write, Op) and write.kind is Kind.WRITE
    s.finished(write, Outcome.OK, 0.04)
    poll = s.next(0.04)  # a write ends the hold
    assert isinstance(poll, Op) and poll.kind is Kind.POLL
    # A read no write follows holds the line for write_hold_s at most.
    s.finished(poll, Outcome.OK, 0.05)
    s.submit(Op("t2", Kind.READ))
    read = s.next(0.05)
    assert isinstance(read, Op)
    s.finished(read, Outcome.OK, 0.06)
    assert s.next(0.07) == pytest.approx(0.09)
    assert isinstance(s.next(0.09), Op)
    with pytest.raises(ValueError):
        schedule(write_hold_s=-1)


def test_writes_to_a_device_keep_its_least_interval() -> None:
    s = schedule(min_write_interval_s={"t1": 2.0})
    write = Op("t1", Kind.WRITE, 20.0)
    s.submit(write)
    assert s.next(0.0) is write
    s.finished(write, Outcome.OK, 0.1)
    again = Op("t1", Kind.WRITE, 21.0)
    s.submit(again)
    polled = s.next(0.2)  # the write waits; polls meanwhile
    assert isinstance(polled, Op) and polled.kind is Kind.POLL
    s.finished(polled, Outcome.OK, 0.3)
    assert s.next(2.1) is again


def test_a_silent_device_is_quarantined_probed_with_backoff_and_rejoins() -> None:
    s = schedule(quarantine_after=2, probe_initial_s=30, probe_max_s=100)
    now = 0.0
    timeouts = 0
    change: Change | None = None
    while change is None:
        op = s.next(now)
        if isinstance(op, float):
            now = op
            continue
        outcome = Outcome.TIMEOUT if op.device == "t2" else Outcome.OK
        timeouts += outcome is Outcome.TIMEOUT
        now += 0.5 if outcome is Outcome.TIMEOUT else 0.1
        change = s.finished(op, outcome, now).change
    assert change == Change("t2", available=False) and timeouts == 2
    with pytest.raises(Refused):
        s.submit(Op("t2", Kind.READ))
    probes = []
    while len(probes) < 3:
        op = s.next(now)
        if isinstance(op, float):
            now = op
            continue
        if op.kind is Kind.PROBE:
            probes.append(now)
            now += 0.5
            s.finished(op, Outcome.TIMEOUT, now)
        else:
            assert op.device != "t2"
            now += 0.1
            s.finished(op, Outcome.OK, now)
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps[0] == pytest.approx(60.5, abs=1.1) and gaps[1] == pytest.approx(100.5, abs=1.1)
    probe = s.next(probes[-1] + 200)
    while not (isinstance(probe, Op) and probe.kind is Kind.PROBE):
        assert isinstance(probe, Op)
        s.finished(probe, Outcome.OK, probes[-1] + 200)
        probe = s.next(probes[-1] + 200)
    assert s.finished(probe, Outcome.OK, probes[-1] + 201).change == Change("t2", True)


def test_urgent_work_of_a_device_being_quarantined_is_refused() -> None:
    s = schedule(quarantine_after=1)
    poll = s.next(0.0)
    assert isinstance(poll, Op) and poll.device == "t1"
    waiting = Op("t1", Kind.WRITE, 22.0)
    s.submit(waiting)
    verdict = s.finished(poll, Outcome.TIMEOUT, 0.5)
    assert verdict.change == Change("t1", False) and verdict.refused == (waiting,)
    assert waiting not in s.pending()


def test_a_line_that_comes_back_gives_everyone_a_fresh_chance() -> None:
    s = schedule(quarantine_after=1)
    poll = s.next(0.0)
    assert isinstance(poll, Op)
    s.finished(poll, Outcome.TIMEOUT, 0.5)
    assert s.quarantined("t1")
    assert s.rejoin_all(1.0) == [Change("t1", True)]
    assert not s.quarantined("t1")


def test_unknown_devices_and_own_kinds_are_refused() -> None:
    s = schedule()
    with pytest.raises(KeyError):
        s.submit(Op("nope", Kind.READ))
    with pytest.raises(ValueError):
        s.submit(Op("t1", Kind.POLL))
    with pytest.raises(ValueError):
        BusSchedule(["a", "a"], poll_interval_s=1)


# ------------------------------------------------------------------ a simulated line


@dataclass
class Line:
    """Devices that answer, time out or garble, on a line where a transaction takes
    `answer_s` and a timeout `timeout_s`."""

    behaviour: dict[str, str]
    answer_s: float = 0.05
    timeout_s: float = 0.3
    now: float = 0.0
    log: list[tuple[float, float, Op, Outcome]] = field(default_factory=list)

    def run(self, op: Op) -> Outcome:
        kind = self.behaviour[op.device]
        outcome = {"ok": Outcome.OK, "dead": Outcome.TIMEOUT, "garbage": Outcome.ERROR}[kind]
        start = self.now
        self.now += self.timeout_s if outcome is Outcome.TIMEOUT else self.answer_s
        self.log.append((start, self.now, op, outcome))
        return outcome


behaviours = st.lists(
    st.sampled_from(["ok", "ok", "ok", "dead", "garbage"]), min_size=1, max_size=8
)
urgent_work = st.lists(
    st.tuples(st.floats(0, 20), st.integers(0, 7), st.sampled_from([Kind.READ, Kind.WRITE])),
    max_size=30,
)


@pytest.mark.thorough
@settings(max_examples=examples(200, 50), deadline=None)
@given(behaviours, urgent_work, st.floats(0.1, 3.0), st.floats(0.0, 2.0))
def test_the_line_keeps_its_promises(
    kinds: list[str], work: list[tuple[float, int, Kind]], poll_s: float, write_gap_s: float
) -> None:
    names = [f"d{i}" for i in range(len(kinds))]
    line = Line(dict(zip(names, kinds, strict=True)))
    s = BusSchedule(
        names,
        poll_interval_s=poll_s,
        min_write_interval_s=write_gap_s,
        quarantine_after=2,
        probe_initial_s=5,
        probe_max_s=20,
    )
    arrivals = sorted(
        ((at, names[i % len(names)], kind) for at, i, kind in work), key=lambda a: a[0]
    )
    submitted: dict[int, float] = {}
    horizon = 60.0
    while line.now < horizon:
        while arrivals and arrivals[0][0] <= line.now:
            _, name, kind = arrivals.pop(0)
            op = Op(name, kind, 20.0 if kind is Kind.WRITE else None)
            try:
                s.submit(op)
                submitted[op.number] = line.now
            except Refused:
                assert s.quarantined(name)
        nxt = s.next(line.now)
        if isinstance(nxt, float):
            # Simulated time only moves on (a wake time in the past means: look again now).
            line.now = max(line.now, min(nxt, arrivals[0][0] if arrivals else horizon, horizon))
            continue
        outcome = line.run(nxt)
        s.finished(nxt, outcome, line.now)

    per_device: dict[str, list[tuple[float, float, Op, Outcome]]] = defaultdict(list)
    for entry in line.log:
        per_device[entry[2].device].append(entry)
    for name, entries in per_device.items():
        writes = [end for _, end, op, _ in entries if op.kind is Kind.WRITE]
        # A device's writes keep its least interval (measured end to start).
        starts = [start for start, _, op, _ in entries if op.kind is Kind.WRITE]
        for previous_end, start in zip(writes, starts[1:], strict=False):
            assert start >= previous_end + write_gap_s - 1e-9
        if line.behaviour[name] in ("dead", "garbage"):
            # Quarantined after two timeouts (three garbled answers); from then on only
            # probes, ever further apart.
            probes = [start for start, _, op, _ in entries if op.kind is Kind.PROBE]
            non_probes = [e for e in entries if e[2].kind is not Kind.PROBE]
            assert len(non_probes) <= (2 if line.behaviour[name] == "dead" else 3)
            gaps = [b - a for a, b in itertools.pairwise(probes)]
            assert all(g >= 5 - 1e-9 for g in gaps)
        else:
            # Every answering device is polled once per interval, or once per cycle of the
            # line when the line is slower (every other device once, a timeout at worst),
            # plus whatever urgent work and probes took the line meanwhile.
            polls = [start for start, _, op, _ in entries if op.kind is Kind.POLL]
            bound = poll_s + len(names) * line.timeout_s + line.answer_s
            for earlier, later in itertools.pairwise([0.0, *polls, horizon - bound]):
                other = sum(
                    end - start
                    for start, end, op, _ in line.log
                    if op.kind is not Kind.POLL and earlier <= start < later
                )
                assert later - earlier - other <= bound + 1e-9, (name, earlier, later)
    # Urgent work waits behind no routine poll but the one on the line when it came, and
    # one a turn for every URGENT_BEFORE_ROUTINE urgent transactions ahead of it (writes
    # only wait for their own device's interval).
    for start, _, op, _ in line.log:
        if op.number in submitted and op.kind is Kind.READ:
            queued_at = submitted[op.number]
            between = [e for e in line.log if queued_at <= e[0] < start]
            polls = [e for e in between if e[2].kind is Kind.POLL]
            urgent = [e for e in between if e[2].number in submitted]
            assert len(polls) <= 1 + len(urgent) // URGENT_BEFORE_ROUTINE


def test_timing_of_a_line() -> None:
    modbus = LineTiming(9600, bits_per_char(8, "E", 1), turnaround_s=0.0)
    assert modbus.bits_per_char == 11
    assert modbus.silent_s == pytest.approx(3.5 * 11 / 9600)
    assert LineTiming(38400, 11, 0.0).silent_s == pytest.approx(0.00175)
    line = LineTiming(9600, bits_per_char(8, "N", 1), turnaround_s=0.0, extra_gap_s=0.01)
    assert line.chars_s(96) == pytest.approx(0.1)
    assert line.transaction_s(16, 48) == pytest.approx(
        64 * 10 / 9600 + TYPICAL_TURNAROUND_S + line.silent_s
    )
    assert LineTiming(9600, 10, turnaround_s=0.2).transaction_s(16, 48) == pytest.approx(
        line.transaction_s(16, 48) - 0.01
    )
    assert cycle_s(line, 32, 16, 48) == pytest.approx(32 * line.transaction_s(16, 48))
    assert line.reply_timeout_s(80) == pytest.approx(2 * 80 * 10 / 9600)
    assert LineTiming(115200, 10, 0.0).reply_timeout_s(10) == 0.05


def test_queued_reads_let_a_due_poll_take_its_turn() -> None:
    """Nine reads of one device queued at once: a poll takes a turn after every
    URGENT_BEFORE_ROUTINE of them, and no more polls than that come between."""
    line = Line({"d0": "ok"})
    s = BusSchedule(["d0"], poll_interval_s=0.25)
    reads = [Op("d0", Kind.READ) for _ in range(9)]
    for op in reads:
        s.submit(op)
    while line.now < 1.0:
        nxt = s.next(line.now)
        if isinstance(nxt, float):
            line.now = max(line.now, min(nxt, 1.0))
            continue
        s.finished(nxt, line.run(nxt), line.now)
    kinds = [op.kind for _, _, op, _ in line.log]
    last_read = max(i for i, kind in enumerate(kinds) if kind is Kind.READ)
    assert kinds[: last_read + 1].count(Kind.READ) == 9
    assert 1 <= kinds[:last_read].count(Kind.POLL) <= 1 + 9 // URGENT_BEFORE_ROUTINE


# ------------------------------------------------------------------ misbehaving devices

POLL_S = 0.03


def test_a_unit_that_timed_out_is_not_polled_into_a_waiting_writes_turn() -> None:
    """A timeout holds the line for the reply timeout and the wait for the late reply: that
    is what the unit's next poll may cost, and it does not start when a write would wait
    for it."""
    s = schedule(poll_s=POLL_S, poll_interval_s=0.1, quarantine_after=5)
    s.finished(Op("t2", Kind.POLL), Outcome.TIMEOUT, 0.0, 1.0)
    s.finished(Op("t1", Kind.WRITE, 21.0), Outcome.OK, 0.0, POLL_S)
    write = Op("t1", Kind.WRITE, 22.0)
    s.submit(write)  # due at 1.0, t1's least write interval after its last
    now, started = 0.5, []
    while (op := s.next(now)) is not write:
        if isinstance(op, float):
            now = max(op, now + 0.001)
            continue
        started.append((now, op.device))
        took = 1.0 if op.device == "t2" else POLL_S
        now += took
        s.finished(op, Outcome.TIMEOUT if op.device == "t2" else Outcome.OK, now, took)
    assert now <= 1.0 + POLL_S
    assert all(device != "t2" for _, device in started), started


@given(st.floats(0.0, 30.0), st.floats(0.2, 2.0), st.floats(0.001, 0.05))
def test_cycles_start_no_closer_than_the_poll_interval(
    late_s: float, interval_s: float, answer_s: float
) -> None:
    """Whenever the first cycle starts (a start-up, a takeover), cycles begin at least one
    interval apart: a late start is no backlog to catch up on back to back."""
    s = BusSchedule(DEVICES, poll_interval_s=interval_s, now=0.0)
    now, starts = late_s, []
    while now < late_s + 10 * interval_s:
        op = s.next(now)
        if isinstance(op, float):
            now = max(now, op)
            continue
        if op.device == DEVICES[0]:
            starts.append(now)
        now += answer_s
        s.finished(op, Outcome.OK, now)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(starts) >= 5
    assert all(gap >= interval_s - 1e-9 for gap in gaps), gaps
    # And no more than the interval apart when the line is faster than it.
    assert all(gap <= interval_s + len(DEVICES) * answer_s + 1e-9 for gap in gaps), gaps
