"""A standby follows every value a point's key had, the ones a change took the place of
before it was delivered included: each is a candidate for what the controller holds at a
takeover (`decisions.takeover_base`)."""

from __future__ import annotations

import logging
from pathlib import Path

from agent.client.statestore import KeyChange
from agent.protocol.hlc import Hlc
from agent.sync.decisions import Synced, takeover_base
from agent.sync.device import DeviceKeys, DeviceSync
from agent.sync.state_file import StateFile


def v(n: int) -> Hlc:
    return Hlc(1_700_000_000_000 + n, 0, "s")


def test_a_value_superseded_before_delivery_is_followed_too(tmp_path: Path) -> None:
    """A soak's stale publish: the active published the unit's 27.0 (its record, written by
    another point meanwhile, did not say so) and a remote 27.5 came 34 ms later; the standby
    got both as one change, 27.5 carrying 27.0. Following only 27.5, it took the unit's 27.0
    for a panel change at the takeover and published it over the remote change."""
    keys = DeviceKeys("t01\\setPoint", "t01\\synced", "t01\\line", "line1")
    sync = DeviceSync(
        "t01",
        None,  # type: ignore[arg-type]  # a standby's following reads nothing from the store
        None,  # type: ignore[arg-type]
        keys,
        StateFile(tmp_path, "t01"),
        logging.getLogger("test"),
        lambda: False,
    )
    change = KeyChange(b"t01\\setPoint", "SET", b"27.5", v(6), earlier=((b"27.0", v(5)),))
    sync.follow_change("setPoint", change)
    seen = list(sync.points["setPoint"].past.seen)
    assert seen == [Synced(27.0, v(5)), Synced(27.5, v(6))]
    record = Synced(23.5, v(1))
    assert takeover_base(record, record, seen, 27.0) == Synced(27.0, v(5))  # not a panel change
