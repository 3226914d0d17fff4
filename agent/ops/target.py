"""Finding what an operator command names, in the store and the agents' retained health
(agent.ops.names says what a name means and what to say when it means nothing)."""

from __future__ import annotations

from agent.client.cli import UsageError
from agent.client.statestore import StateStoreClient
from agent.ops.keys import KeyTemplates
from agent.ops.names import BadName, Reported, Target, UnknownName, check_name, resolve
from agent.ops.retained import Retained
from agent.ops.watch import document, health_filter


def usable_name(name: str, what: str = "line or device") -> str:
    """`check_name` for an operator command: a name the agent could not have is a usage
    error (exit 2), saying the rule."""
    try:
        return check_name(name, what)
    except BadName as exc:
        raise UsageError(str(exc)) from None


async def reported(retained: Retained, templates: KeyTemplates) -> Reported:
    """Every line and device the agents' retained health documents name."""
    await retained.follow(health_filter(templates.health))
    await retained.settle()
    documents = (document(message) for message in retained.messages.values())
    return Reported.from_health(d for d in documents if d is not None)


async def find(
    client: StateStoreClient,
    retained: Retained,
    templates: KeyTemplates,
    name: str,
    *,
    force: bool,
    devices_only: bool = False,
) -> Target:
    """The line (and device) `name` means. Not in any health document, a device is still
    known by the `<device>\\line` key its agent wrote; anything else is UnknownName unless
    `force`, when it is taken as a line (or a device) as named."""
    known = await reported(retained, templates)
    try:
        return resolve(name, known, devices_only=devices_only)
    except UnknownName:
        line, _ = await client.get(templates.keys.of("line", device=name, line=name))
        if line is not None:
            return Target(line.decode(errors="replace"), name)
        if force:
            return Target(name, name if devices_only else None)
        raise
