"""`agent --simulate`: the whole thing on one machine.

A fake line (on TCP, as a serial device server would share it with a pair): one controller,
or with `--units N` a whole multi-drop line of them, each a whole thermostat that the devices
the simulation configures describe with the built-in profile `sim` (every point kept both
ways); an embedded state store unless a broker is configured; and the agent (two with
--pair). With `--status`, the line's status redrawn in place (agent.runtime.simulate_view)
instead of the log. What to try is printed first: a set point and a mode changed in the store
and at the front panel.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path

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
    if modbus and not addresses:
        # A single Modbus device is asked at the unit id the settings give it.
        addresses = [settings.serial.modbus_unit_id]
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
        # Its own health endpoint, on any free port (logged): the first has the configured one.
        port = None if settings.health.port is None else 0
        endpoint = settings.health.model_copy(update={"port": port})
        other = settings.model_copy(
            update={"instance_id": settings.instance_id + "-standby", "health": endpoint}
        )
        instances.append(other)

    hints = simulation_hints(settings, device, embedded=emulator is not None)
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


def agent_command() -> str:
    """How another terminal runs this agent: `agent` when its PATH finds this one without a
    virtual environment activated, else the path of this one's (a venv's bin/agent, which
    works without activating it), else its Python with -m agent."""
    here = Path(sys.executable).parent / "agent"  # not resolved: a venv's python is a link
    found = shutil.which("agent")
    activated = os.environ.get("VIRTUAL_ENV")
    only_activated = activated is not None and Path(found or "").parent == Path(activated) / "bin"
    if found and here.is_file() and Path(found).resolve() == here.resolve() and not only_activated:
        return "agent"
    if here.is_file():
        return shlex.quote(str(here.absolute()))
    return f"{shlex.quote(sys.executable)} -m agent"


def simulation_hints(settings: AgentSettings, device: FakeLine, *, embedded: bool) -> list[str]:
    """What to try, printed before the log (or under the status view), what matters first
    (a terminal too short for all keeps the top): the store's address, then the first
    device's set point changed in the store and at the panel, and with a profile another
    point too (its mode), both ways."""
    host, port = settings.mqtt.host, settings.mqtt.port
    agent = agent_command()
    first = settings.line.devices[0]
    profile = first.resolved_profile
    key = settings.key("setpoint", first.id).replace("'", "'\\''")
    panel_host, panel_port = device.panel_url.removeprefix("tcp://").rsplit(":", 1)  # type: ignore[union-attr]
    # The panel names a unit by its address on an addressed line (a single Modbus
    # device's unit id too).
    address = device.units[0].address if first.address is None else first.address
    at = "" if address is None else f"@{address} "
    panel = f"> /dev/tcp/{panel_host}/{panel_port}"
    devices = ", ".join(
        d.id if d.address is None else f"{d.id} (@{d.address})" for d in settings.line.devices
    )
    line = settings.line.id
    hints = [
        f"state store  mqtt://{host}:{port}" + (" (embedded)" if embedded else ""),
        "From another terminal, change a set point in the store and at the panel:",
        f"  export AGENT_MQTT__HOST={host} AGENT_MQTT__PORT={port}",
        f"  {agent} setpoint set {first.id} 22.5 --wait 5",
        f"  printf '{at}PANEL SP 23.5\\r\\n' {panel}",
    ]
    if profile is not None and "mode" in profile.writable:
        mode_key = settings.point_key("mode", first.id).replace("'", "'\\''")
        hints += [
            "The agent keeps each thermostat's set point, heating and cooling set points,",
            f"mode, fan and occupancy in sync (profile {profile.name}): its mode, both ways",
            "(at the panel: SP, H, C, M, F, O), read back from the store:",
            f"  {agent} setpoint set {first.id} cool --point mode --wait 5",
            f"  printf '{at}PANEL M auto\\r\\n' {panel}",
            f"  {agent} setpoint get {first.id} --point mode",
        ]
        key = f"{key}' '{mode_key}"
    hints += [
        f"line         {line}: {devices}",
        f"front panel  {device.panel_url}",
        f"device line  {device.tcp_url}",
        f"watch the pair: agent status {line} --watch; or the store: agent store watch '{key}'",
        f"hand over: agent switchover {line}; maintenance: agent pause {line}, agent resume",
        "Stop with Ctrl-C.",
    ]
    return hints
