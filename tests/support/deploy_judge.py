"""The rolling-deploy trials' judge (tests/trials/test_rolling_deploys.py), from the model
server's records (what each run's model was offered and told, request by request) and the order
desk's (its writes, per run and per key). The engine's own rows are read for how each run ended
and to check that every drift the model server's records show was audited.

What a model request shows of the definition it was made with (`Seen`): its system text, its
tools (names and argument schemas, the output tool among them) and its response format. Which
code made each tool result: the `code` every result of tests/support/deploy_code.py carries.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from liyagent.local import judge
from tests.support.order_desk import Desk
from tests.support.stack import Stack

DRIFT = "agent.run.definition_drift"
CODE = re.compile(r"""["']code["']\s*:\s*["'](old|new)["']""")


@dataclass(frozen=True)
class Seen:
    """The definition one model request was made with, as the model saw it."""

    system: str
    tools: tuple[tuple[str, str], ...]
    output: str

    @classmethod
    def of(cls, body: dict[str, Any]) -> Seen:
        messages = body.get("messages") or []
        system = [m.get("content") for m in messages if m.get("role") in ("system", "developer")]
        tools = sorted(
            (t["function"]["name"], json.dumps(t["function"].get("parameters"), sort_keys=True))
            for t in body.get("tools") or []
        )
        return cls(json.dumps(system), tuple(tools), json.dumps(body.get("response_format")))

    @property
    def names(self) -> set[str]:
        return {name for name, _ in self.tools}


def codes(body: dict[str, Any]) -> dict[str, str]:
    """The code (`old`, `new`) that made each tool result a request carries, by call id."""
    found = {}
    for m in body.get("messages") or []:
        if m.get("role") == "tool":
            hit = CODE.search(str(m.get("content")))
            if hit:
                found[str(m.get("tool_call_id"))] = hit.group(1)
    return found


@dataclass
class RunRecord:
    """One run as the records show it."""

    run_id: str
    agent: str
    policy: str
    status: str
    failure_code: str | None = None
    seen: list[Seen] = field(default_factory=list)
    asked: Counter[int] = field(default_factory=Counter)
    codes: dict[str, str] = field(default_factory=dict)
    drifts: list[tuple[datetime, dict[str, Any]]] = field(default_factory=list)
    drift_waits: int = 0  # its `agent.run.waiting` rows on a definition
    newer_waits: int = 0  # of them, on a record of a newer format than a worker read
    handed_back: int = 0
    losses: int = 0
    ended_at: datetime | None = None
    first_request: int | None = None  # its first model request's id at the model server
    last_request_at: datetime | None = None  # when the model server took its last request

    @property
    def repins(self) -> int:
        return sum("repinned" in d for _, d in self.drifts)

    def switches(self, reference: Seen) -> int:
        """How often the definition the model saw changed, from the old code's on."""
        seq = [reference, *self.seen]
        return sum(a != b for a, b in itertools.pairwise(seq))

    def drift_wait_s(self) -> float | None:
        """How long it waited for a worker that serves it: from its first drift audit to its
        serving (the audit's own figure) or its failure; None when it never waited."""
        waited = [d for _, d in self.drifts if "policy" in d and d["policy"] == "pinned"]
        if not waited:
            return None
        served = [d["waited_s"] for _, d in self.drifts if "served" in d]
        if served:
            return float(served[-1])
        if self.ended_at is not None:
            return (self.ended_at - self.drifts[0][0]).total_seconds()
        return None


def records(stack: Stack, runs: dict[str, tuple[str, str]]) -> dict[str, RunRecord]:
    """Each run (id -> its agent and policy) as the records show it."""
    ids = list(runs)
    out = {}
    for r in stack.rows(
        "SELECT CAST(id AS text) AS id, status, finished_at FROM runs "
        "WHERE id = ANY(CAST(:ids AS uuid[]))",
        ids=ids,
    ):
        agent, policy = runs[r.id]
        out[r.id] = RunRecord(r.id, agent, policy, r.status, ended_at=r.finished_at)
    for q in stack.vendor(
        "SELECT id, run_id, call, status, body, created_at FROM sim.requests "
        "WHERE vendor = 'model' AND method = 'POST' AND run_id = ANY(:ids) ORDER BY id",
        ids=ids,
    ):
        rec = out[q.run_id]
        rec.first_request = rec.first_request or q.id
        rec.last_request_at = q.created_at
        rec.seen.append(Seen.of(q.body))
        rec.codes |= codes(q.body)
        if q.status == 200:
            rec.asked[int(q.call)] += 1
    for a in stack.rows(
        "SELECT CAST(run_id AS text) AS run_id, kind, detail, created_at FROM audit_events "
        "WHERE run_id = ANY(CAST(:ids AS uuid[])) AND kind IN ('agent.run.definition_drift', "
        "'agent.run.failed', 'agent.run.waiting', 'agent.run.handed_back') ORDER BY id",
        ids=ids,
    ):
        rec = out[a.run_id]
        if a.kind == DRIFT:
            rec.drifts.append((a.created_at, dict(a.detail)))
        elif a.kind == "agent.run.failed":
            rec.failure_code = a.detail.get("code")
        elif a.kind == "agent.run.handed_back":
            rec.handed_back += 1
        elif str(a.detail.get("waiting_on") or "").startswith("definition:"):
            rec.drift_waits += 1
            rec.newer_waits += str(a.detail["waiting_on"]).startswith("definition:newer:")
    with stack.engine.connect() as conn:
        for run_id, lost in judge.losses(conn, ids).items():
            out[run_id].losses = len(lost)
    return out


@dataclass
class DeployVerdict:
    """What the records say went wrong (every list empty: the deploy kept its promises)."""

    lost: list[str] = field(default_factory=list)
    wrong_end: dict[str, str] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    stale: dict[str, dict[int, int]] = field(default_factory=dict)
    mixed: dict[str, int] = field(default_factory=dict)
    without_pinned_tool: list[str] = field(default_factory=list)
    served_by_other_code: list[str] = field(default_factory=list)
    unaudited: list[str] = field(default_factory=list)

    def problems(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v}


def desk_duplicates(desk: Desk) -> dict[str, int]:
    """Writes the desk made more than once: refunds per key and per run, emails per run."""
    made = desk.rows(
        "SELECT path, run_id, idem_key FROM requests WHERE method = 'POST' AND status = 201"
    )
    found = Counter[str]()
    for site, n in Counter((r["path"], "key", r["idem_key"]) for r in made).items():
        found[f"{site[0]} per key"] += n > 1 and site[2] is not None
    for site, n in Counter((r["path"], "run", r["run_id"]) for r in made).items():
        found[f"{site[0]} per run"] += n > 1
    return {k: v for k, v in found.items() if v}


def references(recs: dict[str, RunRecord]) -> dict[str, Seen]:
    """What each agent's model was offered by the old code: its first request of all (made
    before any new worker started)."""
    first: dict[str, Seen] = {}
    for rec in sorted((r for r in recs.values() if r.seen), key=lambda r: r.first_request or 0):
        first.setdefault(rec.agent, rec.seen[0])
    return first


def judge_deploy(
    recs: dict[str, RunRecord],
    refs: dict[str, Seen],
    desk: Desk,
    servable: bool,
    old_gone_at: datetime,
) -> DeployVerdict:
    """Every run ended as its policy says, nothing written twice, no step asked again, no run
    on a mix of definitions, no pinned run without a tool it was pinned to, every drift
    audited (`servable`: the new code serves runs pinned to the old; `old_gone_at`: when the
    last worker of the old code had stopped)."""
    v = DeployVerdict(duplicates=desk_duplicates(desk))
    for rec in recs.values():
        if rec.status not in ("succeeded", "failed"):
            v.lost.append(rec.run_id)
            continue
        end = _wrong_end(rec, servable)
        if end:
            v.wrong_end[rec.run_id] = end
        if any(n > 1 for n in rec.asked.values()) and not rec.losses:
            v.stale[rec.run_id] = dict(rec.asked)
        ref = refs[rec.agent]
        switches = rec.switches(ref)
        if (rec.policy == "pinned" and switches) or switches > 1 or switches > rec.repins:
            v.mixed[rec.run_id] = switches
        if rec.policy == "pinned" and any(not ref.names <= s.names for s in rec.seen):
            v.without_pinned_tool.append(rec.run_id)
        # Pinned to what the new code does not serve: no result of the new code, no request
        # after the old workers were gone (its answer too came from an old worker).
        new_code = "new" in rec.codes.values()
        late = rec.last_request_at is not None and rec.last_request_at > old_gone_at
        if not servable and rec.policy == "pinned" and (new_code or late):
            v.served_by_other_code.append(rec.run_id)
        if not servable and new_code and not rec.repins:
            v.served_by_other_code.append(rec.run_id)
        waited = rec.drift_waits or rec.failure_code == "definition_drift"
        if (waited or switches) and not rec.drifts:
            v.unaudited.append(rec.run_id)
    return v


def _wrong_end(rec: RunRecord, servable: bool) -> str | None:
    """How the run ended against what its policy says, or None when as it says."""
    if rec.status == "succeeded":
        return None
    if not servable and rec.policy == "pinned" and rec.failure_code == "definition_drift":
        return None
    return f"{rec.status} ({rec.failure_code})"


def p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None
