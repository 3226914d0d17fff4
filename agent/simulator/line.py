"""The fake line: units on one medium, in-process.

A FakeLine is a serial line with its devices: one point-to-point device answering
unaddressed line-protocol requests (as `agent sim-device` runs by default), or N units at
addresses 1..N answering in addressed mode (`@<n> ` prefixes), or N Modbus RTU units. It
is served on a pty and/or TCP (`endpoints`) and has a front panel.

The line is one medium: one transaction at a time across all clients and units. A request
that arrives while another is being answered waits for it; with `emulate_baud` each
transaction holds the line for the time its request and reply take at that baud rate, plus
the unit's turnaround (a few milliseconds, as real thermostats take), and on a Modbus line a
frame that starts less than the silent interval (3.5 character times, 1.75 ms above 19200
baud) after the line fell quiet is a framing error and gets no answer, as a real unit would
treat it: a master that leaves no gap is punished here as on a real line.

For checkers it keeps a record of the last `record_limit` requests (when, on which client
connection, to which unit, what) and counters over all of them; each unit keeps its last
writes and panel changes. Tests run the line in an event loop and look inside:
`unit(n)`, `fault()`, `records`, `counters`, `wait_for()`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from agent.controller import line_protocol as lp
from agent.controller.interface import DEFAULT_LIMITS, DeviceIdentity, Limits
from agent.controller.modbus_map import RegisterMap
from agent.controller.profile import Profile
from agent.controller.sim_profile import SIM
from agent.simulator.clock import PreciseSleeper
from agent.simulator.core import (
    DEFAULT_IDENTITY,
    DEFAULT_RECORD_LIMIT,
    DeviceCore,
    FaultCommand,
    Faults,
    PanelSetpoint,
    PanelValue,
    collide,
    decode_request,
    parse_panel_command,
)
from agent.simulator.endpoints import PanelEndpoint, PtyEndpoint, Rfc2217Endpoint, TcpEndpoint
from agent.simulator.rtu import RegisterView
from agent.simulator.unit import DEFAULT_TURNAROUND_S, Unit
from agent.simulator.wires import Incoming, RtuWire, TextWire, Wire

__all__ = ["DEFAULT_TURNAROUND_S", "FakeLine", "LineCounters", "RequestRecord", "Unit"]

log = logging.getLogger(__name__)

WRITE_KINDS = frozenset({"SET SP", "WRITE", "WRITE MULTIPLE"})
"""The kinds of request that write (and `SET <name>` of any point)."""
FAST_BAUD = 19_200
SILENT_FAST_S = 0.00175
"""The silent interval above 19200 baud (Modbus over Serial Line, §2.5.1.1)."""
SILENCE_TOLERANCE = 0.9
"""A gap this share of the silent interval still counts: the fake's clock reads the gap a
little short (the request is timed when it has come in whole, the reply when it was sent)."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request on the device line."""

    at: float
    """time.monotonic() when the request was taken onto the line (after any wait)."""
    channel: str
    """"pty" or "tcp"."""
    line: bytes
    """The request as received (a text line without its terminator, or an RTU frame)."""
    client: str
    """The connection it came on: "pty", or "tcp-<n>" for the n-th TCP connection."""
    address: int | None
    """The unit addressed; None for an unaddressed request (point to point)."""
    kind: str
    """ID, GET SP, SET SP, GET T, GET STATE, GET LIMITS (line protocol), READ HOLDING,
    READ INPUT, WRITE, WRITE MULTIPLE, FUNCTION <n> (Modbus), or INVALID."""
    value: float | None
    """The value written, for writes."""
    answered: bool
    busy_s: float
    """How long the transaction held the line: emulated line time and SLOW faults."""
    waited_s: float
    """How long the request waited for the line."""
    other_client: str | None
    """Another client whose transaction was on the line when this request arrived: on a
    bus with two masters, a collision."""
    seq: int
    """1 for the first request on the line, counting on past the records dropped."""
    request_s: float = 0.0
    """How long the request's own bytes held the line (emulated line time)."""
    point: str | None = None
    """The point a write stores (`setPoint`, `mode`, ...)."""

    @property
    def ended_at(self) -> float:
        """When the transaction's last byte left the line: the reply's, or the request's."""
        return self.at + self.busy_s

    @property
    def request_ended_at(self) -> float:
        """When the master's last byte of the request was on the line."""
        return self.at + self.request_s


@dataclass
class LineCounters:
    """Counters over every request since the line was made (not only those recorded)."""

    requests: int = 0
    answered: int = 0
    collisions: int = 0
    """Requests that arrived while another client's transaction was on the line."""
    connections: int = 0
    """TCP connections accepted on the device line."""
    overruns: int = 0
    """Requests dropped because too many were queued (a flood on the pty)."""
    busy_s: float = 0.0
    """Total time the line was held."""
    work_s: float = 0.0
    """Total time spent computing replies and records (the fake's own cost, without the
    event loop and the system calls around it)."""
    max_wait_s: float = 0.0
    framing_errors: int = 0
    """Frames that started before the line had been quiet for the silent interval: each
    unit takes them for noise and does not answer."""


_SendReply = Callable[[bytes], None]


class FakeLine:
    """A fake serial line with its devices, in-process. start() it, stop() it."""

    def __init__(
        self,
        units: int | None = None,
        *,
        addresses: Iterable[int] | None = None,
        modbus: bool = False,
        register_map: RegisterMap | None = None,
        setpoint: float = 20.0,
        temperature: float = 18.0,
        limits: Limits = DEFAULT_LIMITS,
        time_constant_s: float = 60.0,
        identity: DeviceIdentity = DEFAULT_IDENTITY,
        host: str = "127.0.0.1",
        emulate_baud: int | None = None,
        record_limit: int = DEFAULT_RECORD_LIMIT,
        turnaround_s: float = DEFAULT_TURNAROUND_S,
        profile: Profile = SIM,
        doubled: Iterable[int] = (),
        silent: Iterable[int] = (),
    ) -> None:
        """`units`: N units at addresses 1..N (or give `addresses`); neither: one point-to-
        point device. `doubled`: addresses where a second unit answers too, both at once (a
        collision: the master receives garbage); `silent`: addresses whose unit never
        answers (a dead unit). `modbus` (or a `register_map`): the units speak Modbus RTU with that
        map (default: the Modbus driver's), each at its address as unit id. With
        `emulate_baud`, every unit takes `turnaround_s` before it answers (each unit's
        `turnaround_s` may be set apart). `profile`: how the units' points appear on the
        wire (the `sim` profile's maps by default)."""
        if turnaround_s < 0:
            raise ValueError(f"turnaround_s must be >= 0, not {turnaround_s}")
        if units is not None and addresses is not None:
            raise ValueError("give units or addresses, not both")
        if units is not None:
            if not lp.MIN_ADDRESS <= units <= lp.MAX_ADDRESS:
                raise ValueError(f"units must be {lp.MIN_ADDRESS}..{lp.MAX_ADDRESS}, not {units}")
            addresses = range(1, units + 1)
        chosen: list[int | None] = [None]
        if addresses is not None:
            chosen = [lp.check_address(a) for a in addresses]
            if len(set(chosen)) != len(chosen) or not chosen:
                raise ValueError(f"addresses must be distinct and at least one: {chosen}")
        if emulate_baud is not None and not emulate_baud > 0:
            raise ValueError(f"emulate_baud must be > 0, not {emulate_baud}")
        if record_limit < 1:
            raise ValueError(f"record_limit must be >= 1, not {record_limit}")
        self.wire: Wire
        if modbus or register_map is not None:
            if chosen == [None]:
                raise ValueError("Modbus units need addresses (unit ids)")
            self.register_map: RegisterMap | None = register_map or RegisterMap()
            self.wire = RtuWire(self.register_map, profile.modbus)
        else:
            self.register_map = None
            self.wire = TextWire(profile.line)
        self.profile = profile
        self.host = host
        self.emulate_baud = emulate_baud
        """If set, each transaction holds the line for its request's and reply's line time."""
        self.record_limit = record_limit
        self.turnaround_s = turnaround_s
        self._quiet_since = float("-inf")
        """When the line last fell quiet (the end of the last transaction on it)."""
        self.faults = Faults()
        """Faults of the whole line (FAULT without a prefix): they hit every unit's replies."""
        self.counters = LineCounters()
        self.plug_count = 0
        """How often the line came back after FAULT UNPLUG."""
        now = time.monotonic()

        def make_unit(address: int | None, unit_identity: DeviceIdentity) -> Unit:
            core = DeviceCore(
                now=now,
                setpoint=setpoint,
                temperature=temperature,
                limits=limits,
                time_constant_s=time_constant_s,
                identity=unit_identity,
                record_limit=record_limit,
                profile=profile,
            )
            unit = Unit(self, address, core)
            unit.turnaround_s = turnaround_s
            if self.register_map is not None:
                unit.registers = RegisterView(self.register_map, core)
            return unit

        self._units: dict[int | None, Unit] = {}
        for address in chosen:
            unit_identity = identity
            if address is not None and identity == DEFAULT_IDENTITY:
                unit_identity = replace(identity, serial=f"SIM{address:04d}")
            self._units[address] = make_unit(address, unit_identity)
        self._doubles: dict[int | None, Unit] = {}
        """A second unit at an address, answering with the first (see collide)."""
        for address in doubled:
            if address not in self._units:
                raise ValueError(f"doubled address {address} has no unit on this line")
            first = self._units[address].core.identity
            self._doubles[address] = make_unit(
                address, replace(first, serial=f"SIM{address + 5000:04d}")
            )
        for address in silent:
            if address not in self._units:
                raise ValueError(f"silent address {address} has no unit on this line")
            self._units[address].faults.silent_until = float("inf")
        self._records: deque[RequestRecord] = deque(maxlen=record_limit)
        self._medium = asyncio.Lock()
        self._sleeper = PreciseSleeper("fake-line-clock")
        self._on_line: str | None = None
        self._changed = asyncio.Event()
        self._connection_ids = 0
        self._pty_link: Path | None = None
        self._pty: PtyEndpoint | None = None
        self._tcp_port: int | None = None
        self._tcp: TcpEndpoint | None = None
        self._named_ports: dict[str, int] = {}
        self._named: dict[str, TcpEndpoint] = {}
        self._rfc2217: Rfc2217Endpoint | None = None
        self._panel: PanelEndpoint | None = None
        self._replug: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False

    # --- units and records --------------------------------------------------------------

    @property
    def addressed(self) -> bool:
        """Whether the units have addresses (a multi-drop line)."""
        return None not in self._units

    @property
    def units(self) -> list[Unit]:
        return list(self._units.values())

    def unit(self, address: int | None = None) -> Unit:
        """The unit at `address` (None: the point-to-point device)."""
        try:
            return self._units[address]
        except KeyError:
            raise KeyError(f"no unit at address {address} on this line") from None

    @property
    def records(self) -> list[RequestRecord]:
        """The last record_limit requests on the device line, oldest first."""
        return list(self._records)

    def records_since(self, seq: int) -> list[RequestRecord]:
        """The records after the one numbered `seq` (0: all kept)."""
        return [r for r in self._records if r.seq > seq]

    @property
    def unplugged(self) -> bool:
        return self.faults.unplugged_until is not None

    def notify(self) -> None:
        """Wake every wait_for; each waits on the event current when it last looked."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
        """Wait until predicate() holds; it is checked after every request and change."""
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await self._changed.wait()

    # --- faults of the whole line ---------------------------------------------------------

    def fault(self, kind: str, amount: float = 0.0) -> None:
        """A fault of the whole line. UNPLUG: connections drop and opens fail for `amount`
        seconds; CLEAR: clears the line's faults and every unit's; RESET and POWERCYCLE: each
        unit's (a power cut of the line); others hit every reply."""
        kind = kind.upper()
        if kind == "CLEAR":
            was_unplugged = self.unplugged
            self.faults.clear()
            for unit in self._units.values():
                if unit.faults != Faults():
                    unit.fault("CLEAR")
            if was_unplugged and self._replug is not None:
                self._replug.cancel()
                self._spawn(self._plug())
        elif kind in ("RESET", "POWERCYCLE"):  # a power cut of the whole line, say
            for unit in self._units.values():
                unit.fault(kind, amount)
        elif kind == "UNPLUG":
            self.faults.set(kind, amount, time.monotonic())
            log.info("fake line: unplugged for %s s", amount)
            self._spawn(self._unplug())
            if self._replug is not None:
                self._replug.cancel()
            self._replug = asyncio.get_running_loop().call_later(
                amount, lambda: self._spawn(self._plug())
            )
        else:
            self.faults.set(kind, amount, time.monotonic())
        self.notify()

    # --- the medium -------------------------------------------------------------------------

    def connection_id(self, port: str = "tcp") -> str:
        """A name for a new TCP connection on the device line, after its port's name."""
        self._connection_ids += 1
        self.counters.connections += 1
        return f"{port}-{self._connection_ids}"

    async def transact(
        self, client: str, channel: str, frame: bytes | None, send: _SendReply
    ) -> None:
        """One request from a client: wait for the line, let the addressed unit answer,
        hold the line for the transaction's time, and send the reply (if any)."""
        incoming = self.wire.parse(frame)
        if incoming is None:
            return  # a blank line
        arrived = time.monotonic()
        holder = self._on_line
        other = holder if holder is not None and holder != client else None
        if other is not None:
            self.counters.collisions += 1
        async with self._medium:
            self._on_line = client
            try:
                start = time.monotonic()
                glued = self._too_soon(arrived)
                reply, busy, late_s = self._serve(
                    client, channel, frame, incoming, start, arrived, other, glued
                )
                if busy > 0:
                    await self._sleeper.sleep_until(start + busy)
                self._quiet_since = start + busy
                if reply is not None and late_s > 0:
                    # Out of turn: the line is free meanwhile, so the reply may come in the
                    # middle of the master's next transaction, as a real late unit's would.
                    asyncio.get_running_loop().call_later(late_s, send, reply)
                elif reply is not None:
                    send(reply)
            finally:
                self._on_line = None

    def _too_soon(self, arrived: float) -> bool:
        """A Modbus frame that started before the line was quiet for the silent interval
        (only with line time emulated: without it the line has no time to keep)."""
        if not self.emulate_baud or not isinstance(self.wire, RtuWire):
            return False
        char_s = self.wire.bits_per_char / self.emulate_baud
        silent = SILENT_FAST_S if self.emulate_baud > FAST_BAUD else 3.5 * char_s
        return arrived - self._quiet_since < silent * SILENCE_TOLERANCE

    def _serve(
        self,
        client: str,
        channel: str,
        frame: bytes | None,
        incoming: Incoming,
        now: float,
        arrived: float,
        other: str | None,
        glued: bool = False,
    ) -> tuple[bytes | None, float, float]:
        """The reply (None: nobody answers), how long the line is held, and how long after
        that a late reply comes (LATE: out of turn, the line not held for it). No I/O."""
        work_started = time.perf_counter()
        line_faults = self.faults
        unit = self._units.get(incoming.address)
        reply: bytes | None = None
        slow = late_s = 0.0
        if glued:
            self.counters.framing_errors += 1
        if not (
            glued
            or unit is None
            or unit.faults.unplugged(now)
            or unit.faults.silent(now)
            or line_faults.silent(now)
        ):
            damage = self.wire.damage
            reply = unit.faults.mangle(self.wire.answer(unit, incoming, now, channel), damage)
            double = self._doubles.get(incoming.address)
            if double is not None:
                reply = collide(reply, self.wire.answer(double, incoming, now, channel))
            reply = line_faults.mangle(reply, damage)
            slow = unit.faults.slow_s + line_faults.slow_s
            if incoming.kind in WRITE_KINDS or incoming.kind.startswith("SET "):
                slow += unit.faults.slow_write_s + line_faults.slow_write_s
            late_s = unit.faults.late_s + line_faults.late_s
        busy = slow
        request_s = 0.0
        if self.emulate_baud:
            char_s = self.wire.bits_per_char / self.emulate_baud
            request_s = self.wire.request_size(frame) * char_s
            busy += request_s
            if reply is not None and unit is not None:
                reply_s = unit.turnaround_s + len(reply) * char_s
                if late_s > 0:
                    late_s += reply_s
                else:
                    busy += reply_s
        counters = self.counters
        counters.requests += 1
        if reply is not None:
            counters.answered += 1
        waited = now - arrived
        counters.busy_s += busy
        counters.max_wait_s = max(counters.max_wait_s, waited)
        self._records.append(
            RequestRecord(
                at=now,
                channel=channel,
                line=frame if frame is not None else b"",
                client=client,
                address=incoming.address,
                kind=incoming.kind,
                value=incoming.value,
                answered=reply is not None,
                busy_s=busy,
                waited_s=waited,
                other_client=other,
                seq=counters.requests,
                request_s=request_s,
                point=incoming.point,
            )
        )
        self.notify()
        counters.work_s += time.perf_counter() - work_started
        return reply, busy, late_s

    # --- the front panel --------------------------------------------------------------------

    def panel_reply(self, line: bytes | None) -> bytes | None:
        """The panel's reply to one line: device requests, PANEL (SP, H, C, M, F, O, RH, T)
        and FAULT commands, with an optional `@<n> ` prefix naming the unit (FAULT without
        one: the whole line)."""
        if line is None:
            return lp.encode_line("ERR SYNTAX", with_checksum=False)
        decoded = decode_request(line)
        if decoded is None or isinstance(decoded, bytes):
            return decoded
        try:
            address, payload = lp.split_address(decoded.payload)
        except lp.ProtocolError:
            return lp.encode_line("ERR SYNTAX", with_checksum=decoded.checksummed)
        text = lp.format_reply(self._panel_command(address, payload))
        return lp.encode_line(lp.with_address(address, text), with_checksum=decoded.checksummed)

    def _panel_command(self, address: int | None, payload: str) -> lp.Reply:
        try:
            command = parse_panel_command(payload)
            if isinstance(command, FaultCommand) and address is None:
                self.fault(command.kind, command.amount)
                return lp.OkReply()
            unit = self._units.get(address)
            if unit is None:
                return lp.ErrorReply("ADDRESS")
            if command is None:
                names = () if self.profile.line is None else self.profile.line.writable_names
                request = lp.parse_request(payload, names)
                reply = unit.core.answer(request, time.monotonic(), "panel")
                self.notify()
                return reply
            if isinstance(command, PanelSetpoint):
                return unit.panel_setpoint(command.value)
            if isinstance(command, PanelValue):
                return unit.panel_value(command.point, command.text)
            unit.fault(command.kind, command.amount)
            return lp.OkReply()
        except lp.RequestError as exc:
            return lp.ErrorReply(exc.code)

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(
        self,
        *,
        pty_link: str | Path | None = None,
        tcp_port: int | None = None,
        panel_port: int | None = None,
        rfc2217_port: int | None = None,
    ) -> Self:
        """Serve the device line on a pty (symlink at pty_link) and/or TCP (raw, and/or as
        RFC 2217), and the panel on TCP. Port 0 picks a free port."""
        if all(end is None for end in (pty_link, tcp_port, panel_port, rfc2217_port)):
            raise ValueError("give the line a pty link or a TCP port to be served on")
        self._changed = asyncio.Event()
        self._started = True
        try:
            if pty_link is not None:
                self._attach_pty(pty_link)
            if tcp_port is not None:
                self._tcp = await TcpEndpoint.listen(self, self.host, tcp_port)
                # Keep the port picked for 0: after an unplug the line comes back on it.
                self._tcp_port = self._tcp.port
            if panel_port is not None:
                self._panel = await PanelEndpoint.listen(self, self.host, panel_port)
            if rfc2217_port is not None:
                self._rfc2217 = await Rfc2217Endpoint.listen(
                    self, self.host, rfc2217_port, name="rfc2217"
                )
        except BaseException:
            await self.stop()
            raise
        return self

    def _attach_pty(self, link: str | Path) -> None:
        # Creating a pty and a symlink are quick local calls, fine on the loop.
        self._pty_link = Path(link).absolute()
        self._pty = PtyEndpoint(self, self._pty_link)

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self._replug is not None:
            self._replug.cancel()
            self._replug = None
        for unit in self._units.values():
            unit._cancel_timers()
        for task in list(self._tasks):
            task.cancel()
        await self._unplug()
        self._sleeper.close()
        for endpoint in (self._panel, self._rfc2217):
            if endpoint is not None:
                await endpoint.close()
        self._panel = self._rfc2217 = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def open_connections(self) -> int:
        """Masters connected to the line on TCP now (each agent driving it holds one)."""
        endpoints = [self._tcp, *self._named.values()]
        return sum(len(endpoint.writers) for endpoint in endpoints if endpoint is not None)

    async def open_port(self, name: str) -> str:
        """Another TCP port onto the same line (a serial device server with a port per
        master), whose connections the records name `<name>-<n>`: who sent what is known
        from the wire alone. Its socket:// URL; the same port again for the same name."""
        if not self._started:
            raise RuntimeError("start the line first")
        if name in self._named:
            return f"socket://{self.host}:{self._named_ports[name]}"
        endpoint = await TcpEndpoint.listen(
            self, self.host, self._named_ports.get(name, 0), name=name
        )
        self._named[name] = endpoint
        self._named_ports[name] = endpoint.port
        return f"socket://{self.host}:{endpoint.port}"

    async def _unplug(self) -> None:
        # Detached before the awaits: a replug meanwhile makes new endpoints.
        pty, self._pty = self._pty, None
        tcp, self._tcp = self._tcp, None
        named, self._named = self._named, {}
        if pty is not None:
            await pty.close()
        for endpoint in [tcp, *named.values()]:
            if endpoint is not None:
                await endpoint.close()
        self.notify()

    async def _plug(self) -> None:
        self._replug = None
        self.faults.unplugged_until = None
        if not self._started:
            return
        try:
            if self._pty_link is not None and self._pty is None:
                self._pty = PtyEndpoint(self, self._pty_link)
            if self._tcp_port is not None and self._tcp is None:
                self._tcp = await TcpEndpoint.listen(self, self.host, self._tcp_port)
            for name, port in self._named_ports.items():
                if name not in self._named:
                    self._named[name] = await TcpEndpoint.listen(self, self.host, port, name=name)
        except OSError:
            log.exception("fake line: could not come back")
            return
        self.plug_count += 1
        log.info("fake line: plugged in again")
        self.notify()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- endpoints ------------------------------------------------------------------------------

    @property
    def pty_link(self) -> str | None:
        """The device path to open (a symlink to the current pty)."""
        return None if self._pty_link is None else str(self._pty_link)

    @property
    def tcp_url(self) -> str | None:
        return None if self._tcp_port is None else f"socket://{self.host}:{self._tcp_port}"

    @property
    def rfc2217_url(self) -> str | None:
        endpoint = self._rfc2217
        return None if endpoint is None else f"rfc2217://{self.host}:{endpoint.port}"

    @property
    def panel_address(self) -> tuple[str, int] | None:
        return None if self._panel is None else (self.host, self._panel.port)

    @property
    def panel_url(self) -> str | None:
        return None if self._panel is None else f"tcp://{self.host}:{self._panel.port}"

    def ready_line(self) -> str:
        """`device <url> [device <url>] [panel <url>]`, as sim-device prints it."""
        words: list[str] = []
        for url in (self.pty_link, self.tcp_url, self.rfc2217_url):
            if url is not None:
                words += ["device", url]
        if self.panel_url is not None:
            words += ["panel", self.panel_url]
        return " ".join(words)
