"""The devices file a scan writes: one device per unit found, named after the line and its
address, with the chosen profile (and its definition, when it is not a built-in one), in
the form AGENT_DEVICES_FILE takes (agent.config.devices, agent.config.profiles). Pure."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from agent.config.line import check_id


def device_id(line_id: str, address: int) -> str:
    """`floor3-007`: the line's id and the unit's address."""
    return check_id(f"{line_id}-{address:03d}")


def render(
    line_id: str,
    addresses: Iterable[int],
    profile: str | None = None,
    definition: Mapping[str, object] | None = None,
) -> str:
    """The file's text. `definition`: the profile as configured, for one that is not built
    in (the file then carries it, so that it loads as it is)."""
    devices: list[dict[str, object]] = []
    for address in sorted(set(addresses)):
        device: dict[str, object] = {"id": device_id(line_id, address), "address": address}
        if profile is not None:
            device["profile"] = profile
        devices.append(device)
    # One device a line: a file of 32 stays readable and its changes show line by line.
    body = ",\n".join(f"    {json.dumps(d)}" for d in devices)
    head = ""
    if profile is not None and definition is not None:
        shown = json.dumps({profile: definition}, indent=2).replace("\n", "\n  ")
        head = f'  "profiles": {shown},\n'
    return f'{{\n{head}  "devices": [\n{body}\n  ]\n}}\n'
