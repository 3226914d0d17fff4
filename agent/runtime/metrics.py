"""What an instance shows Prometheus on `/metrics` of its health endpoint.

Nothing is counted here: the bus, the store client, the pair and each point's sync keep
their counts where things happen (agent.tally), and the collector reads them, with the
gauges (the role, the lease, the readings), only when scraped. Every series is labelled
by line and instance; the other labels are names from the configuration (a unit, a
point) or from a fixed set (a function, a result, a reason), never a value.
"""

from __future__ import annotations

import functools
import os
import resource
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agent.client.session import Session
from agent.client.statestore import REQUEST_BOUNDS_S, StateStoreClient
from agent.config import Line
from agent.line.bus import TRANSACTION_BOUNDS_S, Bus
from agent.pair.leadership import Leadership, Role
from agent.runtime.control import LineControl
from agent.runtime.driving import ActiveLine
from agent.runtime.exposition import Family, Kind, text
from agent.sync.device import DeviceSync
from agent.sync.status import READ_BACK_BOUNDS_S
from agent.tally import Tally

if TYPE_CHECKING:
    from agent.config import AgentSettings

SET_POINTS = ("setPoint", "heatSetPoint", "coolSetPoint")


class Source(Protocol):
    """What the collector reads of an agent (agent.runtime.agent.Agent)."""

    @property
    def role(self) -> Role: ...
    @property
    def bus(self) -> Bus | None: ...

    settings: AgentSettings
    line: Line
    """The line as it runs now (a reload may change it)."""
    control: LineControl | None
    leadership: Leadership | None
    active_line: ActiveLine | None
    devices: dict[str, DeviceSync]
    client: StateStoreClient | None
    session: Session | None


class _Families:
    """Metric families that share the line and instance labels."""

    def __init__(self, line: str, instance: str) -> None:
        self.base = [line, instance]
        self.made: list[Family] = []

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Family:
        return self._family(name, doc, "gauge", labels)

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Family:
        return self._family(name, doc, "counter", labels)

    def _family(self, name: str, doc: str, kind: Kind, labels: Sequence[str]) -> Family:
        family = Family(name, doc, kind, ("line", "instance", *labels))
        self.made.append(family)
        return family

    def counts(
        self, name: str, doc: str, labels: Sequence[str], tallies: Iterable[tuple[Key, Tally]]
    ) -> None:
        """A counter from tallies' counts, each key behind its prefix of label values."""
        family = self.counter(name, doc, labels)
        for prefix, tally in tallies:
            for key, n in tally.items():
                family.add([*self.base, *prefix, *key], n)

    def histogram(
        self,
        name: str,
        doc: str,
        labels: Sequence[str],
        bounds: Sequence[float],
        tallies: Iterable[tuple[Key, Tally]],
    ) -> None:
        family = self._family(name, doc, "histogram", labels)
        names = [repr(float(bound)) for bound in bounds] + ["+Inf"]
        for prefix, tally in tallies:
            for key, durations in tally.histograms():
                buckets = list(zip(names, durations.cumulative(), strict=True))
                family.add_histogram([*self.base, *prefix, *key], buckets, durations.total_s)

    def one(self, family: Family, value: float, *labels: str) -> None:
        family.add([*self.base, *labels], value)


Key = tuple[str, ...]


class AgentCollector:
    def __init__(self, agent: Source) -> None:
        self.agent = agent

    def collect(self) -> list[Family]:
        families = _Families(self.agent.line.id, self.agent.settings.instance_id)
        self._pair(families)
        self._line(families)
        self._devices(families)
        self._store(families)
        return families.made

    # ------------------------------------------------------------------ the pair

    def _pair(self, f: _Families) -> None:
        agent, leadership = self.agent, self.agent.leadership
        role = agent.role
        f.one(f.gauge("agent_active", "1 while this instance is the line's active."),
              int(role is Role.ACTIVE))  # fmt: skip
        f.one(f.gauge("agent_standby", "1 while this instance is a standby."),
              int(role is Role.STANDBY))  # fmt: skip
        f.one(f.gauge("agent_paused", "1 while the line is paused (closed, lock kept)."),
              int(agent.control is not None and agent.control.paused))  # fmt: skip
        unheld = f.gauge(
            "agent_lock_unheld", "1 while, as this instance sees it, nobody holds the lock."
        )
        changes = f.counter(
            "agent_role_changes", "Role changes by reason: takeover, switchover, self_fence, "
            "lost_lease.", ["reason"]
        )  # fmt: skip
        lease = f.gauge("agent_lease_left_seconds", "Of this instance's lease (0: not held).")
        token_age = f.gauge(
            "agent_fencing_token_age_seconds", "Since the lock's token was granted or renewed."
        )
        if leadership is None:
            return
        held = leadership.lock.held
        f.one(unheld, int(not held and leadership.seen_holder is None))
        for (reason,), n in leadership.role_changes.items():
            f.one(changes, n, reason)
        deadline = leadership.lock.deadline
        f.one(lease, max(0.0, deadline - time.monotonic()) if held and deadline else 0.0)
        token = leadership.lock.token
        if token is not None and held:
            f.one(token_age, max(0.0, time.time() - token.wall_ms / 1000))

    # ------------------------------------------------------------------ the line

    def _line(self, f: _Families) -> None:
        active_line, bus = self.agent.active_line, self.agent.bus
        tallies = [] if active_line is None else [((), active_line.transactions)]
        f.counts(
            "agent_line_transactions",
            "Transactions on the line by unit, function and result (ok, timeout, corrupt, "
            "exception, refused by the lease's gate, line_down).",
            ["unit", "function", "result"],
            tallies,
        )
        f.histogram(
            "agent_line_transaction_seconds", "A transaction's time, by function.",
            ["function"], TRANSACTION_BOUNDS_S, tallies,
        )  # fmt: skip
        events = [] if active_line is None else [((), active_line.line_events)]
        f.counts("agent_line_port", "The port opened and lost.", ["event"], events)
        up = f.gauge("agent_line_up", "1 while this instance drives the line and its port is open.")
        f.one(up, int(bus is not None and bus.line_up))
        if bus is None:
            return
        cycle = bus.schedule.last_cycle_s
        if cycle is not None:
            f.one(f.gauge("agent_line_cycle_seconds", "The last complete poll cycle."), cycle)
        waiting = f.gauge("agent_line_queue", "What waits for the line, by kind.", ["kind"])
        for kind, n in bus.schedule.waiting().items():
            f.one(waiting, n, kind)

    # ------------------------------------------------------------------ devices

    def _devices(self, f: _Families) -> None:
        devices, bus = self.agent.devices, self.agent.bus
        up = f.gauge(
            "agent_device_up",
            "1 while the active drives the unit and it answers (not quarantined).",
            ["device"],
        )
        read_at = f.gauge(
            "agent_device_last_reading_timestamp_seconds",
            "When the unit last answered a read (Unix time).", ["device"]
        )  # fmt: skip
        temperature = f.gauge("agent_device_temperature_celsius", "As last read.", ["device"])
        humidity = f.gauge("agent_device_humidity_percent", "As last read.", ["device"])
        setpoint = f.gauge(
            "agent_device_setpoint_celsius", "Set points as last read.", ["device", "point"]
        )
        writes = [
            ((name, point_name), point.status.counters.writes)
            for name, sync in devices.items()
            for point_name, point in sync.points.items()
        ]
        f.counts(
            "agent_device_writes",
            "Writes of a point by origin (remote, panel, restore) and result (applied, "
            "refused, not_confirmed, not_sent).",
            ["device", "point", "origin", "result"],
            writes,
        )
        f.histogram(
            "agent_device_remote_to_readback_seconds",
            "From a remote change (its version's time) to the unit's read-back.",
            ["device", "point", "origin"],
            READ_BACK_BOUNDS_S,
            writes,
        )
        if bus is None:
            return
        wall_minus_monotonic = time.time() - time.monotonic()
        for name in devices:
            handle = bus.handles.get(name)
            if handle is None:
                continue
            f.one(up, int(handle.available and not bus.schedule.quarantined(name)), name)
            state, at = handle.last_state, handle.last_state_at
            if state is None or at is None:
                continue
            f.one(read_at, at + wall_minus_monotonic, name)
            f.one(temperature, state.temperature, name)
            _number(f, humidity, state.points, "humidity", name)
            f.one(setpoint, state.setpoint, name, "setPoint")
            for point in SET_POINTS[1:]:
                _number(f, setpoint, state.points, point, name, point)

    # ------------------------------------------------------------------ the store

    def _store(self, f: _Families) -> None:
        client, session = self.agent.client, self.agent.session
        tallies = [] if client is None else [((), client.requests)]
        f.counts(
            "agent_store_requests", "State store requests by command and result (ok, "
            "timeout, error).", ["command", "result"], tallies
        )  # fmt: skip
        f.histogram(
            "agent_store_request_seconds", "A request's round trip, by command.",
            ["command"], REQUEST_BOUNDS_S, tallies
        )  # fmt: skip
        connected = f.gauge("agent_store_connected", "1 while connected to the broker.")
        f.one(connected, int(session is not None and session.connected))
        reconnects = f.counter("agent_store_reconnects", "Connections after the first.")
        notified = f.counter("agent_store_notifications", "KEYNOTIFY notifications received.")
        seen = f.gauge(
            "agent_store_last_seen_timestamp_seconds",
            "When the store last answered a request (Unix time).",
        )
        if client is None:
            return
        f.one(reconnects, client.reconnects)
        f.one(notified, client.notifications)
        if client.answered_at is not None:
            f.one(seen, client.answered_at)


def _number(
    f: _Families,
    family: Family,
    values: Mapping[str, object],
    point: str,
    *labels: str,
) -> None:
    value = values.get(point)
    if isinstance(value, int | float) and not isinstance(value, bool):
        f.one(family, float(value), *labels)


class Metrics:
    """What one agent answers `/metrics` with: its own families and the process's (CPU,
    memory, open files), under the names Prometheus's client libraries give the latter."""

    def __init__(self, agent: Source) -> None:
        self.collector = AgentCollector(agent)

    def exposition(self) -> bytes:
        return text([*self.collector.collect(), *process_families()])


_PAGE = os.sysconf("SC_PAGESIZE")
_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields() -> list[str]:
    """/proc/self/stat after the process's name (which may hold spaces), from field 3 on."""
    stat = Path("/proc/self/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()


@functools.cache
def _started_s() -> float:
    """When this process started (Unix time): boot time plus its start in clock ticks,
    read once (neither changes)."""
    boot_s = next(
        float(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime ")
    )
    return boot_s + int(_stat_fields()[19]) / _TICKS


def process_families() -> list[Family]:
    """This process's own, read from /proc when scraped; none where it cannot be read."""
    try:
        fields = _stat_fields()
        started_s = _started_s()
        open_fds = len(os.listdir("/proc/self/fd"))
    except (OSError, StopIteration, ValueError, IndexError):
        return []
    cpu_s = (int(fields[11]) + int(fields[12])) / _TICKS
    virtual, resident = int(fields[20]), int(fields[21]) * _PAGE
    max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    shown: list[tuple[str, str, Kind, float]] = [
        ("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge", virtual),
        ("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge", resident),
        ("process_start_time_seconds", "Start time of the process since unix epoch in "
         "seconds.", "gauge", started_s),
        ("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
         "counter", cpu_s),
        ("process_open_fds", "Number of open file descriptors.", "gauge", open_fds),
        ("process_max_fds", "Maximum number of open file descriptors.", "gauge", max_fds),
    ]  # fmt: skip
    families = []
    for name, doc, kind, value in shown:
        family = Family(name, doc, kind)
        family.add((), value)
        families.append(family)
    return families
