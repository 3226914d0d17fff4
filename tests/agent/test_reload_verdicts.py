"""Each reload's verdict, as the agent writes it and `agent reload` reads it, pure but for a
temporary directory: whole, the last refusal kept until a reload loads."""

from __future__ import annotations

from pathlib import Path

from agent.runtime.reloading import VERDICT_FILE, ReloadVerdicts, Verdict, decode, encode


def test_a_refusal_stays_until_a_reload_loads(tmp_path: Path) -> None:
    verdicts = ReloadVerdicts(tmp_path)
    assert verdicts.refused is None
    verdicts.record("invalid setting AGENT_DEVICES_FILE (x): bad")
    first = decode((tmp_path / VERDICT_FILE).read_bytes())
    assert first is not None and (first.reloads, first.refused) == (1, verdicts.refused)
    verdicts.record(None)
    second = decode((tmp_path / VERDICT_FILE).read_bytes())
    assert second is not None and (second.reloads, second.refused) == (2, None)
    assert verdicts.refused is None
    assert [p.name for p in tmp_path.iterdir()] == [VERDICT_FILE]  # nothing half written left


def test_outside_systemd_nothing_is_written() -> None:
    verdicts = ReloadVerdicts(None)
    verdicts.record("bad")
    assert verdicts.refused == "bad"


def test_anything_else_is_no_verdict() -> None:
    assert decode(encode(Verdict(3, None, 1.5))) == Verdict(3, None, 1.5)
    for raw in (b"", b"[", b"[]", b'{"reloads":"1","refused":null,"at":1}', b"\xff"):
        assert decode(raw) is None, raw
