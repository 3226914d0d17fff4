"""The peer of the line benchmarks: a Modbus poller built the way gateway users run one today.

    python -m tests.bench.peer_poller --url socket://127.0.0.1:PORT --store-port PORT
        --units N [--baud 9600] [--scan-interval-s 1] [--timeout-s 0.3] [--retries 3]

Built as Home Assistant's Modbus hub and its entities are: one pymodbus async client
(AsyncModbusSerialClient, RTU) behind one asyncio.Lock, each call followed, inside the lock,
by the message wait a serial line needs (here the line's silent interval, rounded up to the
millisecond, where the hub's default is 30 ms); one polling entity per unit, each on a
timer of its own (all started together, a tick skipped while its previous update is still
running), reading set point and temperature in one request; a set point change is a write
of the register, then the entity's update (the read-back). pymodbus retries a request that
timed out (three times, as the hub configures it); the timeout is the user's choice.

It keeps the store's set points in sync as the agent does: it observes each unit's
`t<NN>\\setPoint` (KEYNOTIFY) and writes a remote change to the unit, and publishes a set
point it polls that differs from what it last knew (a panel change), ignoring a poll that
was in flight while it wrote. It prints `peer ready` once every unit was read once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pymodbus.client import AsyncModbusSerialClient
from pymodbus.exceptions import ModbusException
from pymodbus.framer import FramerType

from agent.client.session import Session
from agent.client.statestore import KeyChange, StateStoreClient
from agent.config import MqttSettings
from agent.controller import line_protocol as lp

SCALE = 10
SETPOINT_REGISTER = 0


class Hub:
    """One client, one lock; the message wait inside the lock."""

    def __init__(self, client: AsyncModbusSerialClient, msg_wait_s: float) -> None:
        self.client = client
        self.msg_wait_s = msg_wait_s
        self.lock = asyncio.Lock()

    async def call(self, request: Callable[[], Awaitable[Any]]) -> Any:
        async with self.lock:
            try:
                result = await request()
            except ModbusException:
                result = None
            if result is not None and result.isError():
                result = None
            if self.msg_wait_s:
                await asyncio.sleep(self.msg_wait_s)
        return result


def decode(raw: int) -> float:
    return (raw - 0x10000 if raw >= 0x8000 else raw) / SCALE


class Thermostat:
    """One entity: polls its unit on its own timer and keeps its key in sync."""

    def __init__(self, hub: Hub, store: StateStoreClient, unit: int, scan_s: float) -> None:
        self.hub = hub
        self.store = store
        self.unit = unit
        self.key = f"t{unit:02d}\\setPoint"
        self.scan_s = scan_s
        self.setpoint: float | None = None
        self.available = False
        self.writes = 0
        self._updating = asyncio.Lock()
        self._writing = asyncio.Lock()

    async def update(self) -> float | None:
        """The entity's update: one read of set point and temperature."""
        async with self._updating:
            writes = self.writes
            client = self.hub.client
            result = await self.hub.call(
                lambda: client.read_holding_registers(
                    SETPOINT_REGISTER, count=2, device_id=self.unit
                )
            )
            self.available = result is not None
            if result is None:
                return None
            value = decode(result.registers[0])
            if writes != self.writes or self._writing.locked():
                return value  # in flight while a write went out: stale
            if self.setpoint is not None and value != self.setpoint:
                self.setpoint = value
                await self.store.set(self.key, lp.format_number(value))  # a panel change
            self.setpoint = value
            return value

    async def run(self, start: float) -> None:
        """A timer of its own: a tick every scan interval from `start`, skipped while the
        previous update still runs."""
        tick = start
        while True:
            tick += self.scan_s
            await asyncio.sleep(max(0.0, tick - time.monotonic()))
            if not self._updating.locked():
                asyncio.get_running_loop().create_task(self.update())

    async def remote(self, value: float) -> None:
        """A set point from the store: write it, then read it back."""
        async with self._writing:
            if value == self.setpoint:
                return
            raw = round(value * SCALE) & 0xFFFF
            client = self.hub.client
            await self.hub.call(
                lambda: client.write_register(SETPOINT_REGISTER, raw, device_id=self.unit)
            )
            self.writes += 1
            result = await self.hub.call(
                lambda: client.read_holding_registers(
                    SETPOINT_REGISTER, count=2, device_id=self.unit
                )
            )
            if result is None:
                return
            held = decode(result.registers[0])
            self.setpoint = held
            if held != value:
                await self.store.set(self.key, lp.format_number(held))


async def serve(args: argparse.Namespace) -> None:
    client = AsyncModbusSerialClient(
        args.url,
        framer=FramerType.RTU,
        baudrate=args.baud,
        bytesize=8,
        parity=args.parity,
        stopbits=args.stopbits,
        timeout=args.timeout_s,
        retries=args.retries,
    )
    if not await client.connect():
        raise SystemExit(f"peer: cannot open {args.url}")
    char_s = 11 / args.baud
    silent_s = 0.00175 if args.baud > 19200 else 3.5 * char_s
    msg_wait_s = (
        args.msg_wait_ms / 1000
        if args.msg_wait_ms is not None
        else math.ceil(silent_s * 1000) / 1000
    )
    hub = Hub(client, msg_wait_s)
    session = Session(
        MqttSettings(host="127.0.0.1", port=args.store_port), client_id=f"peer-{time.time_ns()}"
    )
    await session.start(wait=True, timeout=10)
    tasks: set[asyncio.Task[Any]] = set()
    try:
        async with StateStoreClient(session) as store:
            entities = [
                Thermostat(hub, store, unit, args.scan_interval_s)
                for unit in range(1, args.units + 1)
            ]

            def changed(entity: Thermostat) -> Callable[[KeyChange], None]:
                def handler(change: KeyChange) -> None:
                    if change.value is None:
                        return
                    with contextlib.suppress(ValueError):
                        task = asyncio.get_running_loop().create_task(
                            entity.remote(float(change.value))
                        )
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)

                return handler

            for entity in entities:
                await store.observe(entity.key, changed(entity))
            for entity in entities:
                await entity.update()
            start = time.monotonic()
            timers = [asyncio.create_task(entity.run(start)) for entity in entities]
            print(f"peer ready (message wait {msg_wait_s * 1000:g} ms)", flush=True)
            await asyncio.gather(*timers)
    finally:
        await session.stop()
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--store-port", type=int, required=True)
    parser.add_argument("--units", type=int, required=True)
    parser.add_argument("--baud", type=int, default=9600)
    parser.add_argument("--parity", default="E")
    parser.add_argument("--stopbits", type=int, default=1)
    parser.add_argument("--scan-interval-s", type=float, default=1.0)
    parser.add_argument("--timeout-s", type=float, default=0.3)
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument(
        "--msg-wait-ms", type=float, default=None, help="default: the silent interval, rounded up"
    )
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    sys.exit(0)


if __name__ == "__main__":
    main()
