"""The core's tables: runs, their steps, call marks and audit, approvals, stops, principals
and the documents source syncs write."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, UUID

from store.schema.base import CALL_STATUSES, metadata, now
from store.usage import usage_columns

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", UUID(as_uuid=False), primary_key=True),
    # Stable identity of the run across attempts; step keys are derived from it.
    sa.Column("correlation_id", sa.Text, nullable=False),
    # Set when the caller starts a run idempotently; one run per key and principal.
    sa.Column("request_key", sa.Text, nullable=True),
    # SHA-256 of what identifies the request under that key (agent, input, parameters): the
    # same key with other parameters is refused, never answered with this run.
    sa.Column("request_digest", sa.Text, nullable=True),
    sa.Column("agent", sa.Text, nullable=False),
    sa.Column("owner", sa.Text, nullable=False),
    # The front principal whose bearer token started the run (a sub-agent run: its parent's);
    # NULL for a run started inside the deployment (client API, cron, Teams, jobs). It scopes
    # the request key and who may read the run through the front (store/scope.py).
    sa.Column("principal", sa.Text, nullable=True),
    sa.Column("entry_kind", sa.Text, nullable=False, server_default="plain"),
    # agent (model loop) or workflow (deterministic step graph).
    sa.Column("kind", sa.Text, nullable=False, server_default="agent"),
    # Where the run came from and answers to; a disabled channel stops it (a gate).
    sa.Column("channel", sa.Text, nullable=False, server_default="api"),
    # The principal the run acts as; it must still be allowed to act (a gate).
    sa.Column("run_as", sa.Text, nullable=True),
    # A sub-agent run points at the parent call that delegated to it.
    sa.Column("parent_run_id", UUID(as_uuid=False), nullable=True),
    # What a waiting run waits for: approval:<id>, child:<run id>, timer:<epoch seconds>,
    # model:<profile>:<opens at> or tenant (its tenant's runs in flight at their bound).
    sa.Column("waiting_on", sa.Text, nullable=True),
    # Written ahead (checkpointed) so a loss resumes it; a lost run that is not is failed
    # `interrupted` (TICKETIQ_CRASH_RESUME_ENTRIES=false entry runs, some jobs).
    sa.Column("resumable", sa.Boolean, nullable=False, server_default=sa.true()),
    # When the answer's keep ended by the setting at its delivery: a record only. The purge and
    # retention count the setting in force from `finished_at`, so a lowered keep applies to
    # answers delivered before (store/entries.py `purge_answers`, store/retention.py).
    sa.Column("answer_expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("answer_purged_at", sa.DateTime(timezone=True), nullable=True),
    # The run's definition as it was enqueued (its model, tools, system prompt, entry details,
    # workflow or job, and who it is), sealed with the run id bound in
    # (runtime/durable/definition.py): a worker acts on nothing else. NULL once erased.
    sa.Column("definition", sa.LargeBinary, nullable=True),
    sa.Column("status", sa.Text, nullable=False, server_default="queued"),
    # Fencing token: bumped by every claim and hand-back; only the current attempt writes.
    sa.Column("attempt", sa.Integer, nullable=False, server_default="1"),
    sa.Column("lost_count", sa.Integer, nullable=False, server_default="0"),
    # Deliveries of the current attempt's message, to bound a message whose process always dies.
    sa.Column("deliveries", sa.Integer, nullable=False, server_default="0"),
    # Model steps whose answers are written in a checkpoint.
    sa.Column("step", sa.Integer, nullable=False, server_default="0"),
    # What the run was asked (the first line of its transcript).
    sa.Column("input", sa.Text, nullable=False, server_default=""),
    # The run's base checkpoint: its whole state, sealed with the run id and its step bound in,
    # written at enqueue (step 0). Each step after adds a record to `run_steps` (what it added,
    # chained); a run checkpointed before step records existed keeps its whole latest state
    # here, and its step records continue from it.
    sa.Column("checkpoint", sa.LargeBinary, nullable=True),
    # The attempt that wrote it and when (inspect, the stale-write judge).
    sa.Column("checkpoint_attempt", sa.Integer, nullable=True),
    sa.Column("checkpointed_at", sa.DateTime(timezone=True), nullable=True),
    # Why the current attempt exists: NULL (first), or a `ResumeReason` (store/states.py).
    sa.Column("resume_reason", sa.Text, nullable=True),
    # A lost run this running first attempt is asked to yield its slot to (resumed runs first,
    # runtime/flow/order.py): set by the loss's claim, read with the gates at the next step
    # boundary, which hands the run back while that run is still queued; NULL when not asked.
    sa.Column("yield_for", UUID(as_uuid=False), nullable=True),
    # Whose share of the fleet the run takes (runtime/flow/tenants.py): its owner unless its
    # caller named a tenant; NULL for a run stored before tenants existed (no tenant's).
    sa.Column("tenant", sa.Text, nullable=True),
    # 1 low, 2 normal, 3 high: the order its first message is served in, and a held run's turn.
    sa.Column("priority", sa.SmallInteger, nullable=False, server_default="2"),
    # Which worker process took the current attempt, and when (inspect, the trials' judge).
    sa.Column("claimed_by", sa.Text, nullable=True),
    sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("failure_reason", sa.Text, nullable=True),
    # The final answer, sealed with the run id bound in.
    sa.Column("answer", sa.LargeBinary, nullable=True),
    # The usage of the model step that gave the final answer (store/usage.py), written in the
    # statement that stores the answer; NULL when its provider said none (or no model answered).
    *usage_columns("answer_"),
    # What it may spend (tokens, US dollars; NULL: no bound), store/budgets.py.
    sa.Column("budget_tokens", sa.BigInteger, nullable=True),
    sa.Column("budget_usd", sa.Numeric(18, 9), nullable=True),
    # What of the code it was started against (runtime/durable/pins.py), sealed; NULL for a
    # run stored before pins. Since when it waits for a worker whose code serves it.
    sa.Column("pin", sa.LargeBinary, nullable=True),
    sa.Column("drift_since", sa.DateTime(timezone=True), nullable=True),
    # What a Stop does to it (store/gates.py `insert_stop`): NULL, it fails at once; a Python
    # workflow that catches a Stop is `compensate`, and a Stop turns it `compensating` and
    # queues it for an attempt that raises the Stop in the function (runtime/core/pyflow.py).
    sa.Column("on_stop", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True, server_default=now()),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint(
        "status IN ('queued','running','waiting','answered','succeeded','failed')", name="status"
    ),
    sa.CheckConstraint("attempt >= 1", name="attempt_positive"),
    sa.CheckConstraint("kind IN ('agent','workflow','job')", name="kind"),
    sa.CheckConstraint("priority BETWEEN 1 AND 3", name="priority"),
    sa.CheckConstraint("on_stop IN ('compensate', 'compensating')", name="on_stop"),
    # A request key names one run per principal: another caller's key is another run, never
    # theirs (runs started inside the deployment, principal NULL, share one scope).
    sa.Index(
        "uq_runs_request_key_principal",
        "request_key",
        "principal",
        unique=True,
        postgresql_nulls_not_distinct=True,
        postgresql_where=sa.text("request_key IS NOT NULL"),
    ),
    sa.Index(
        "ix_runs_queued_at",
        "queued_at",
        postgresql_where=sa.text("status = 'queued'"),
    ),
    sa.Index(
        "ix_runs_parent_run_id",
        "parent_run_id",
        postgresql_where=sa.text("parent_run_id IS NOT NULL"),
    ),
    sa.Index(
        "ix_runs_answer_expires_at",
        "answer_expires_at",
        postgresql_where=sa.text("answer IS NOT NULL AND status = 'succeeded'"),
    ),
    sa.Index(
        "ix_runs_waiting",
        "id",
        postgresql_where=sa.text("status = 'waiting'"),
    ),
    sa.Index(
        "ix_runs_live",
        "id",
        postgresql_where=sa.text("status IN ('running','answered')"),
    ),
    # The running first attempts a loss's claim may ask to yield, youngest first.
    sa.Index(
        "ix_runs_first_running",
        "claimed_at",
        postgresql_where=sa.text("status = 'running' AND attempt = 1"),
    ),
    # Lost runs waiting for a slot: what an asked run's gates look for (store/gates.py).
    sa.Index(
        "ix_runs_queued_lost",
        "id",
        postgresql_where=sa.text("status = 'queued' AND resume_reason = 'lost'"),
    ),
    # A tenant's runs in flight (counted when it is bounded) and its held runs, in their turn.
    sa.Index(
        "ix_runs_tenant_live",
        "tenant",
        postgresql_where=sa.text(
            "status IN ('queued','running','answered') "
            "OR (status = 'waiting' AND waiting_on LIKE 'model:%')"
        ),
    ),
    sa.Index(
        "ix_runs_tenant_held",
        "tenant",
        sa.text("priority DESC"),
        "queued_at",
        postgresql_where=sa.text("status = 'waiting' AND waiting_on = 'tenant'"),
    ),
    # Retention takes finished runs oldest first, a bounded batch at a time.
    sa.Index(
        "ix_runs_finished_at",
        "finished_at",
        "id",
        postgresql_where=sa.text("status IN ('succeeded','failed')"),
    ),
)

run_steps = sa.Table(
    "run_steps",
    metadata,
    # One sealed record per model step: only what the step added since the record before (the
    # model's answer, the calls it asked, the tool results that arrived since, the counters that
    # changed), sealed with the run id, its step and the digest of the record before bound in
    # (I6). Written before any call of the step is made, with the run's step counter, in one
    # fenced statement (I3, I5); a resume reads them in one query and rebuilds the state.
    sa.Column("run_id", UUID(as_uuid=False), sa.ForeignKey("runs.id", ondelete="CASCADE")),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("sealed", sa.LargeBinary, nullable=False),
    # The usage its model's response reported (store/usage.py), written in the same statement
    # as the record: only a written step's usage is here, once (I5); NULL when the provider
    # said none, or for a step no model answered (a workflow's, a job's).
    *usage_columns(),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.PrimaryKeyConstraint("run_id", "step"),
    sa.CheckConstraint("step >= 1", name="step_positive"),
)

call_marks = sa.Table(
    "call_marks",
    metadata,
    sa.Column("run_id", UUID(as_uuid=False), sa.ForeignKey("runs.id", ondelete="CASCADE")),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("call_index", sa.Integer, nullable=False),
    sa.Column("call_id", sa.Text, nullable=False),
    sa.Column("tool", sa.Text, nullable=False),
    # The call's kind when it was marked; a call marked a write stays one (I7).
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("idem_key", sa.Text, nullable=False),
    # False when the key is fresh per call (positional tool-call id): never sent again with it.
    sa.Column("stable_key", sa.Boolean, nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default="in_doubt"),
    # The tool's result, sealed; reused by a resume instead of settling the call.
    sa.Column("outcome", sa.LargeBinary, nullable=True),
    # How a resume settled it: resent, read_back, sent_after_read, unknown.
    sa.Column("settlement", sa.Text, nullable=True),
    # The attempt that last wrote the mark (marked it, or recorded or settled its outcome).
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("marked_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
    # The attempt that first marked it, and when: never moved by a resume marking it again (a
    # keyed write sent again moves `attempt` and `marked_at`), so its run event keeps its
    # place (store/events.py). NULL on marks written before they existed.
    sa.Column("first_attempt", sa.Integer, nullable=True),
    sa.Column("first_marked_at", sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint("run_id", "step", "call_index"),
    sa.CheckConstraint(
        "status IN (" + ",".join(f"'{s}'" for s in CALL_STATUSES) + ")", name="status"
    ),
)

audit_events = sa.Table(
    "audit_events",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("run_id", UUID(as_uuid=False), nullable=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=True),
    sa.Column("step", sa.Integer, nullable=True),
    sa.Column("detail", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Index("ix_audit_events_run_id", "run_id"),
    sa.Index("ix_audit_events_kind", "kind"),
    # Retention takes audit rows oldest first, once their run is gone.
    sa.Index("ix_audit_events_created_at", "created_at", "id"),
)

transcript_messages = sa.Table(
    "transcript_messages",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column(
        "run_id", UUID(as_uuid=False), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    # user, assistant (the answer) or notice (what the platform tells the reader).
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Index("ix_transcript_messages_run_id", "run_id"),
)

# Gates, read as they stand now at every start, resume and step (I7).

agent_tools = sa.Table(
    "agent_tools",
    metadata,
    # Containment: an agent with rows here may use only these tools.
    sa.Column("agent", sa.Text, nullable=False),
    sa.Column("tool", sa.Text, nullable=False),
    sa.PrimaryKeyConstraint("agent", "tool"),
)

stops = sa.Table(
    "stops",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    # An operator's Stop of one run, or of every run of an agent.
    sa.Column("run_id", UUID(as_uuid=False), nullable=True),
    sa.Column("agent", sa.Text, nullable=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("created_by", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Column("lifted_at", sa.DateTime(timezone=True), nullable=True),
    # Who lifted it (the principal of the front's token, or the CLI's --by).
    sa.Column("lifted_by", sa.Text, nullable=True),
    sa.CheckConstraint("(run_id IS NULL) <> (agent IS NULL)", name="one_target"),
    sa.Index("ix_stops_run_id", "run_id", postgresql_where=sa.text("lifted_at IS NULL")),
    sa.Index("ix_stops_agent", "agent", postgresql_where=sa.text("lifted_at IS NULL")),
    # Retention and erasure delete a run's stops, lifted or not.
    sa.Index("ix_stops_run_id_all", "run_id"),
)

channels = sa.Table(
    "channels",
    metadata,
    # A channel without a row is enabled; disabling one stops its runs at their next step.
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
)

principals = sa.Table(
    "principals",
    metadata,
    # A principal without a row may run and act; a row can revoke either.
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("may_run", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("may_act", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
)

approvals = sa.Table(
    "approvals",
    metadata,
    sa.Column("id", UUID(as_uuid=False), primary_key=True),
    sa.Column(
        "run_id", UUID(as_uuid=False), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("call_index", sa.Integer, nullable=False),
    # One request per step key: routing the call again coalesces with the request waiting.
    sa.Column("step_key", sa.Text, nullable=False),
    sa.Column("tool", sa.Text, nullable=False),
    sa.Column("args", JSONB, nullable=False),
    # pending, approved or denied.
    sa.Column("status", sa.Text, nullable=False, server_default="pending"),
    sa.Column("decided_by", sa.Text, nullable=True),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('pending','approved','denied')", name="status"),
    sa.Index("uq_approvals_step_key", "step_key", unique=True),
    sa.Index("ix_approvals_run_id", "run_id"),
)


documents = sa.Table(
    "documents",
    metadata,
    # What source syncs write: upserted by (source, doc id), so a page synced twice is harmless.
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("doc_id", sa.Text, nullable=False),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("content_hash", sa.Text, nullable=False),
    # Bumped only when the content changes.
    sa.Column("version", sa.Integer, nullable=False, server_default="1"),
    sa.Column("synced_by", UUID(as_uuid=False), nullable=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.PrimaryKeyConstraint("source", "doc_id"),
)


code_versions = sa.Table(
    "code_versions",
    metadata,
    # A version of the deployment's code (runtime/durable/pins.py `code_version`) and when the
    # fleet first saw it: which of two versions is the newer (store/pins.py `newer_code`).
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False, server_default=now()),
)

# Messages sent to a run (store/signals.py): each taken once, by the step whose identity it
# names (a workflow's `wait_signal`) or by an agent's next step boundary; a sender's key makes a
# send idempotent.
signals = sa.Table(
    "signals",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column(
        "run_id", UUID(as_uuid=False), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("name", sa.Text, nullable=False),
    # The message; emptied (NULL) by an erasure of its run.
    sa.Column("payload", JSONB, nullable=True),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("sent_by", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Column("taken_by", sa.Text, nullable=True),
    sa.Column("taken_at", sa.DateTime(timezone=True), nullable=True),
    sa.Index("uq_signals_run_id_key", "run_id", "key", unique=True),
    sa.Index("ix_signals_run_id_name", "run_id", "name"),
)

# Events published to whichever workflows wait for them (store/workflow_events.py): a
# workflow's `wait_event` takes the first one of its name and match published after it first
# met the step. Kept for the key window (LIYAGENT_RETENTION_KEY_WINDOW_S, store/retention.py).
workflow_events = sa.Table(
    "workflow_events",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("match", sa.Text, nullable=False, server_default=""),
    # What a wait is for (runtime/durable/keys.py `event_digest` of name and match).
    sa.Column("digest", sa.Text, nullable=False),
    sa.Column("payload", JSONB, nullable=True),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("sent_by", sa.Text, nullable=False),
    # The front principal that published it: it reaches only that principal's runs. Empty:
    # published inside the deployment (the client, the CLI), it reaches every run. A key
    # dedupes within one principal's events.
    sa.Column("principal", sa.Text, nullable=False, server_default=""),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now()),
    sa.Index("uq_workflow_events_name_principal_key", "name", "principal", "key", unique=True),
    sa.Index("ix_workflow_events_digest_id", "digest", "id"),
    sa.Index("ix_workflow_events_created_at", "created_at"),
)
