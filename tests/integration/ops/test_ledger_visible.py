"""The ledger where people see it: `liyagent usage` (by agent, tenant, day; scoped to a front
principal), `liyagent inspect`, and the Prometheus counters read at scrape time (tokens and
dollars by kind, exact or unconfirmed, tenants as the deployment names them). Rows written
by the ledger's own statements: a step's usage and cost, a claim's unconfirmed usage."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal

from liyagent.local.procs import ROOT
from runtime.ops.metrics import postgres_families
from store.checkpoints import write_checkpoint
from store.ledger import Note
from store.losses import claim_lost_many
from store.usage import StepUsage
from tests.support.stored_runs import stored_run


def _run(stack, agent: str, tenant: str, principal: str | None = None) -> str:
    """A run taken by its first attempt (never published)."""
    return stored_run(stack, agent, claimed=True, tenant=tenant, principal=principal)


def _ledger(stack) -> dict[str, str]:
    """Two agents, two tenants: exact usage in both, one loss's unconfirmed usage."""
    a = _run(stack, "triage", "acme", principal="alice")
    b = _run(stack, "triage", "globex")
    c = _run(stack, "billing", "acme")
    with stack.db() as conn:
        write_checkpoint(conn, a, 1, 1, b"1", StepUsage(100, 10, 20, "m", Decimal("0.001")))
        write_checkpoint(conn, b, 1, 1, b"1", StepUsage(200, 20, 0, "m", Decimal("0.002")))
        write_checkpoint(conn, c, 1, 1, b"1", StepUsage(400, 40, 0, "unpriced"))
        note = Note(a, 1, 2, 900, 64, "m", Decimal("0.01"))
        assert len(claim_lost_many(conn, [(a, 1)], 3, notes=[note])) == 1
    return {"a": a, "b": b, "c": c}


def _cli(stack, *args: str) -> object:
    done = subprocess.run(
        [sys.executable, "-m", "liyagent", *args, "--json"],
        cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _lines(report: object) -> dict[str, dict[str, object]]:
    assert isinstance(report, dict)
    return {line["key"]: line for line in report["lines"]}


def test_the_usage_report_by_agent_tenant_and_day(stack) -> None:
    runs = _ledger(stack)
    by_agent = _lines(_cli(stack, "usage", "--by", "agent"))
    assert set(by_agent) == {"triage", "billing"}
    triage = by_agent["triage"]
    assert (triage["runs"], triage["input_tokens"], triage["output_tokens"]) == (2, 300, 30)
    assert (triage["unconfirmed_input_tokens"], triage["unconfirmed_output_tokens"]) == (900, 64)
    assert (triage["cost_usd"], triage["unconfirmed_cost_usd"]) == ("0.003000000", "0.010000000")
    assert by_agent["billing"]["unpriced"] == 1 and by_agent["billing"]["cost_usd"] == "0"
    by_tenant = _lines(_cli(stack, "usage", "--by", "tenant"))
    assert {k: v["input_tokens"] for k, v in by_tenant.items()} == {"acme": 500, "globex": 200}
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    by_day = _lines(_cli(stack, "usage", "--by", "day"))
    assert by_day[today]["input_tokens"] == 700 and by_day[today]["runs"] == 3
    # A front principal's report holds only the runs it started.
    own = _lines(_cli(stack, "usage", "--by", "agent", "--principal", "alice"))
    assert {k: v["input_tokens"] for k, v in own.items()} == {"triage": 100}
    # inspect shows the run's usage rows and totals, exact and unconfirmed apart.
    report = _cli(stack, "inspect", runs["a"])
    assert isinstance(report, dict)
    assert [(e["step"], e["unconfirmed"], e["input_tokens"]) for e in report["ledger"]] == [
        (1, False, 100),
        (2, True, 900),
    ]
    assert report["usage"]["unconfirmed_input_tokens"] == 900


def test_the_counters_by_kind_confirmed_and_tenant(stack) -> None:
    _ledger(stack)
    with stack.db() as conn:
        families = {f.name: f for f in postgres_families(conn, frozenset({"acme"}))}
    tokens = {tuple(s.labels.values()): s.value for s in families["liyagent_model_tokens"].samples}
    # globex is not a tenant the deployment names: it is `other`.
    assert tokens[("input", "exact", "acme")] == 500
    assert tokens[("input", "exact", "other")] == 200
    assert tokens[("cached", "exact", "acme")] == 20
    assert tokens[("input", "unconfirmed", "acme")] == 900
    assert tokens[("output", "unconfirmed", "other")] == 0
    cost = {tuple(s.labels.values()): s.value for s in families["liyagent_model_cost_usd"].samples}
    assert cost[("exact", "acme")] == 0.001 and cost[("unconfirmed", "acme")] == 0.01
    assert {s.labels["tenant"] for s in families["liyagent_model_tokens"].samples} == {
        "acme",
        "other",
    }


def test_a_report_over_no_days_is_refused(stack) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "liyagent", "usage", "--days", "0"],
        cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--days" in done.stderr
