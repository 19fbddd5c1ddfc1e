"""A call outside every scope (a person's ad hoc call) gets a fresh key per call (I8)."""

from __future__ import annotations

from runtime.ops.adhoc import adhoc_call


def test_each_adhoc_call_gets_a_fresh_key(stack) -> None:
    s = stack.services
    first = adhoc_call(
        s.tools, s.engine, s.settings.timings, "incident.create", {"title": "manual"}, by="alice"
    )
    second = adhoc_call(
        s.tools, s.engine, s.settings.timings, "incident.create", {"title": "manual"}, by="alice"
    )
    assert first["key"] != second["key"]
    keys = stack.vendor(
        "SELECT idem_key, deduped FROM sim.requests WHERE idem_key IN (:a, :b)",
        a=first["key"],
        b=second["key"],
    )
    assert sorted(k.idem_key for k in keys) == sorted([first["key"], second["key"]])
    assert not any(k.deduped for k in keys)
    audit = stack.rows("SELECT detail FROM audit_events WHERE kind = 'tool.adhoc_call'")
    assert [a.detail["by"] for a in audit] == ["alice", "alice"]
