"""The broker restarts 20 times, a remote change made each time while the pair is away:
every change reaches the controller after the reconnect, none is lost, no agent process
dies, and the active registers its KEYNOTIFY again every time. Marked "soak" (about a
minute): run by .ci/run with the other soak tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import default_client_id
from tests.support.rig import DEVICE, LOCK_KEY, SETPOINT_KEY, Rig

pytestmark = pytest.mark.soak

ROUNDS = 20
SETPOINT = SETPOINT_KEY.encode()


def active_client(rig: Rig) -> str:
    """The active's client id: its instance's, with the process named in the lock's holder
    value (`a#3f9a2c1d`)."""
    entry = rig.background.call(lambda: rig.store.store.entry(LOCK_KEY.encode()))
    assert entry is not None, "nobody holds the lock"
    instance, _, process = entry.value.decode().partition("#")
    return f"{default_client_id(DEVICE, instance)}-{process}"


def registered(rig: Rig, client_id: str) -> bool:
    return rig.background.call(lambda: SETPOINT in rig.store.store.registrations(client_id))


@pytest.mark.timeout(300)
def test_every_change_made_during_a_broker_restart_is_applied(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        rig.start_active("a")
        rig.start_agent("b")
        rig.wait_store_value(b"20.0")
        applied: list[str] = []
        for n in range(ROUNDS):
            away = f"{15 + n * 0.5:.1f}"  # made while the agents cannot reach the store
            after = f"{25 + n * 0.5:.1f}"  # made once they are back
            forgetting = n % 2 == 1
            if forgetting:
                # The store comes back empty but for the change: lock, records, all gone.
                rig.store_restart_forgetting(setpoint=away.encode())
            else:
                client = active_client(rig)
                rig.broker_down()
                # The store forgets the registrations of clients that left.
                assert not registered(rig, client)
                rig.write_directly(away.encode())
                rig.broker_up()
            rig.wait_device(lambda d, v=float(away): d.setpoint == v, timeout=20)
            # Back as active: its KEYNOTIFY is registered again, and a change made through
            # the store now reaches the controller on its notification (the reconcile
            # safety net runs only every 60 s).
            assert rig.remote_set(after.encode()) == b"+OK\r\n"
            rig.wait_device(lambda d, v=float(after): d.setpoint == v, timeout=10)
            assert registered(rig, active_client(rig)), f"round {n + 1}: no KEYNOTIFY"
            applied += [away, after]
        assert [p.proc.poll() for p in rig.agents] == [None, None], "an agent process died"
        assert len(applied) == 2 * ROUNDS
        assert rig.store_value() == applied[-1].encode()
    finally:
        rig.close()
