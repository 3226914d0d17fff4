"""A store that went back in time: restarted holding what it held before its last writes
(restored from a backup, or its log's tail lost), writes it had acknowledged among them.
The agent's last sync is newer than the key; the person's change it synced must not be
taken back by the stale value the store now holds."""

from __future__ import annotations

import pytest

from tests.support.rig import ACTIVE, LOCK_KEY, RECORD_KEY, Rig

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("lock", ["lost", "kept"])
def test_a_change_synced_before_the_store_went_back_is_published_again(rig: Rig, lock: str) -> None:
    """The panel's 23.5 published, acknowledged and recorded; the store restarts holding
    the 20.0 from before it. With the lock lost too, the agent took it again and fenced the
    key by writing the stale 20.0 back with its own token, newer than its sync, then read
    that as a remote change and applied 20.0 to the unit; with the lock kept, the stale key
    counted as in sync and nothing repaired it. Now the store gets 23.5 back and the unit
    keeps it."""
    active, _ = rig.start_active("a")
    rig.wait_store_value(b"20.0")
    before = rig.snapshot()
    rig.panel(23.5)
    rig.wait_key(RECORD_KEY, lambda record: record is not None and b'"value":23.5' in record)
    rig.store_restart_from(before, without=(LOCK_KEY,) if lock == "lost" else ())
    if lock == "lost":
        active.wait_for_new(ACTIVE)
    rig.wait_store_value(b"23.5")
    rig.wait_key(RECORD_KEY, lambda record: record is not None and b'"value":23.5' in record)
    assert rig.device_writes() == [], "the unit was written the stale value"
    assert active.proc.poll() is None
