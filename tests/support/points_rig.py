"""A line of whole thermostats for process tests: the fake line's units, each configured
with the built-in profile `sim`, on either protocol, served by real agent processes (see
LineRig): every point of every unit in its own key, changed remotely or at the panel."""

from __future__ import annotations

import contextlib
import json
import queue
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.controller import line_protocol as lp
from agent.controller import points
from agent.controller.interface import PointValue
from agent.simulator.core import SIM_VALUES
from agent.simulator.line import FakeLine
from tests.support.rig import LineRig

WRITABLE = ("setPoint", "heatSetPoint", "coolSetPoint", "mode", "fan", "occupied")
"""The sim profile's points the agent writes."""
AT_START: dict[str, PointValue] = {
    name: value for name, value in {"setPoint": 20.0, **SIM_VALUES}.items() if name in WRITABLE
}
"""What every unit of the rig holds in its writable points when the line starts."""


def text(point: str, value: PointValue) -> bytes:
    """A point's value as its key holds it (`21.5`, `cool`, `true`)."""
    return points.encode(points.point(point), value)


class PointsRig(LineRig):
    """`units` thermostats at addresses 1..N, devices `t01`..`tNN` with profile `sim`, on a
    line speaking the line protocol or (`modbus`) Modbus RTU."""

    def __init__(self, tmp_path: Path, units: int, *, modbus: bool = False, **options: Any) -> None:
        self.modbus = modbus
        super().__init__(tmp_path, units, **options)

    def _make_device(self) -> Any:
        return FakeLine(
            units=self.units,
            modbus=self.modbus,
            setpoint=20.0,
            time_constant_s=30.0,
            emulate_baud=self.emulate_baud,
        )

    def env(self, instance: str, **extra: str) -> dict[str, str]:
        env = super().env(instance)
        env["AGENT_DEVICES"] = json.dumps(
            [
                {"id": self.device_id(n), "address": n, "profile": "sim"}
                for n in range(1, self.units + 1)
            ]
        )
        if self.modbus:
            env["AGENT_SERIAL__DRIVER"] = "modbus"
        env.update(extra)
        return env

    # ------------------------------------------------------------------ the store

    def point_key(self, address: int, point: str) -> str:
        return f"{self.device_id(address)}\\{point}"

    def remote_point(self, address: int, point: str, value: PointValue) -> bytes:
        """A remote writer changing one point, fenced with the line's lock."""
        lock = self.client.request("GET", self.lock_key)
        token = lock.prop("__ts")
        key = self.point_key(address, point)
        return self.client.request("SET", key, text(point, value), ft=token).payload

    def wait_points(
        self, expected: Mapping[tuple[int, str], PointValue], timeout: float = 10.0
    ) -> None:
        """Waits until every (address, point) key holds its expected value, on the keys'
        notifications."""
        wanted = {key: text(key[1], value) for key, value in expected.items()}
        for address, point in wanted:
            self.client.request("KEYNOTIFY", self.point_key(address, point))
        deadline = time.monotonic() + timeout
        while True:
            held = {key: self.store_value(self.point_key(*key)) for key in wanted}
            if held == wanted:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                differ = {k: (held[k], v) for k, v in wanted.items() if held[k] != v}
                raise AssertionError(f"the store holds (held, wanted): {differ}")
            with contextlib.suppress(queue.Empty):
                self.client.notifications.get(timeout=remaining)

    # ------------------------------------------------------------------ the units

    def panel_point(self, address: int, point: str, value: PointValue) -> None:
        """A person changes a point at the unit's panel."""
        reply = self.background.call(lambda: self.unit(address).panel_point(point, value))
        assert not isinstance(reply, lp.ErrorReply), reply

    def unit_points(self, address: int) -> dict[str, PointValue]:
        return self.background.call(lambda: self.unit(address).core.point_values(time.monotonic()))

    def wait_units(
        self, expected: Mapping[tuple[int, str], PointValue], timeout: float = 10
    ) -> None:
        """Waits until every unit holds what `expected` gives it ((address, point): value)."""

        def held() -> bool:
            now = time.monotonic()
            return all(
                points.same(self.device.unit(a).core.point_values(now)[p], v)
                for (a, p), v in expected.items()
            )

        try:
            self.wait_line(lambda _: held(), timeout)
        except TimeoutError:
            now = {key: self.unit_points(key[0])[key[1]] for key in expected}
            raise AssertionError(f"the units hold {now}, not {dict(expected)}") from None

    def point_writes(self, address: int, point: str) -> list[PointValue]:
        """The values of `point` the agents wrote to the unit (panel changes left out)."""
        return self.background.call(
            lambda: [w.value for w in self.unit(address).writes if w.point == point]
        )
