"""`agent --simulate`: the whole thing on one machine.

A fake line (on TCP, as a serial device server would share it with a pair): one controller,
or with `--units N` a whole multi-drop line of them; an embedded state store unless a broker
is configured; and the agent (two with --pair). With `--status`, the line's status redrawn
in place (agent.runtime.simulate_view) instead of the log.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from agent.config import AgentSettings, HealthSettings
from agent.emulator.embedded import EmbeddedStateStore
from agent.runtime.agent import Agent
from agent.simulator.line import FakeLine


async def simulate(
    settings: AgentSettings, *, pair: bool, use_broker: bool, status: bool = False
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    emulator = None
    if not use_broker:
        emulator = EmbeddedStateStore("127.0.0.1", 0)
        await emulator.start()
        mqtt = settings.mqtt.model_copy(update={"host": emulator.host, "port": emulator.port})
        settings = settings.model_copy(update={"mqtt": mqtt})
    addresses = [d.address for d in settings.line.devices if d.address is not None]
    modbus = settings.serial.driver == "modbus"
    device = FakeLine(addresses=addresses or None, modbus=modbus)
    await device.start(tcp_port=0, panel_port=0)
    serial = settings.serial.model_copy(update={"url": device.tcp_url})
    settings = settings.model_copy(update={"serial": serial})
    if status and settings.health.interval_s == HealthSettings().interval_s:
        # The temperatures move in the view every second, not every heartbeat.
        health = settings.health.model_copy(update={"interval_s": 1.0})
        settings = settings.model_copy(update={"health": health})
    instances = [settings]
    if pair:
        other = settings.model_copy(update={"instance_id": settings.instance_id + "-standby"})
        instances.append(other)

    host, port = settings.mqtt.host, settings.mqtt.port
    first = settings.line.devices[0]
    key = settings.key("setpoint", first.id).replace("'", "'\\''")
    panel_host, panel_port = device.panel_url.removeprefix("tcp://").rsplit(":", 1)  # type: ignore[union-attr]
    at = "" if first.address is None else f"@{first.address} "
    devices = ", ".join(
        d.id if d.address is None else f"{d.id} (@{d.address})" for d in settings.line.devices
    )
    line = settings.line.id
    hints = [
        f"state store  mqtt://{host}:{port}" + (" (embedded)" if emulator is not None else ""),
        f"line         {line}: {devices}",
        f"front panel  {device.panel_url}",
        f"device line  {device.tcp_url}",
        "",
        "From another terminal: change a set point in the store,",
        f"  export AGENT_MQTT__HOST={host} AGENT_MQTT__PORT={port}",
        f"  agent setpoint set {first.id} 22.5 --wait 5",
        "or at the device's front panel:",
        f"  printf '{at}PANEL SP 23.5\\r\\n' > /dev/tcp/{panel_host}/{panel_port}",
        f"watch the pair: agent status {line} --watch; or the store: agent store watch '{key}'",
        f"hand over: agent switchover {line}; maintenance: agent pause {line}, agent resume",
        "Stop with Ctrl-C.",
    ]
    if not status:
        print("\n".join(hints) + "\n", flush=True)
    try:
        agents = [Agent(s) for s in instances]
        runs = [a.run(stop) for a in agents]
        if status:
            from agent.runtime.simulate_view import capture_logs, status_view

            view = status_view(settings, hints, capture_logs(), stop)
            results = (await asyncio.gather(*runs, view))[: len(agents)]
        else:
            results = await asyncio.gather(*runs)
    finally:
        await device.stop()
        if emulator is not None:
            await emulator.stop()
    sys.stdout.flush()
    return max(results, default=0)
