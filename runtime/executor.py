"""What a worker does with one run message: fence it, lease the run, execute, let go.

Every delivery is fenced at its start: the message's attempt must equal Postgres's and the
lease must be free (`SET NX`); otherwise the message is stale or the run is alive elsewhere,
and it is acked and dropped (I4). The sweeper resumes a run whose lease lapses.
"""

from __future__ import annotations

import structlog

from runtime import faults
from runtime.agent import AgentRun
from runtime.heartbeat import LeaseLost
from runtime.jobs import JobRun
from runtime.leases import Token, monotonic_ms
from runtime.services import Services
from runtime.workflow import WorkflowRun
from store.rows import FencedOut
from store.runs import claim_queued, count_delivery, fail_run

log = structlog.get_logger(__name__)


def run_message(s: Services, run_id: str, attempt: int) -> str:
    """Handle one delivery of the message for (run, attempt); returns how it ended."""
    bound = log.bind(run_id=run_id, attempt=attempt)
    with s.engine.connect() as conn:
        row = count_delivery(conn, run_id, attempt)
        if row is None:
            bound.info("message.stale")
            return "stale"
        if row.deliveries > s.settings.timings.delivery_limit:
            fail_run(
                conn,
                run_id,
                attempt,
                reason=f"its message was delivered {row.deliveries} times and its worker "
                "died before starting it each time; check the workers' logs",
                audit_kind="agent.run.failed",
                detail={"code": "poison"},
            )
            return "poison"
    token = Token(run_id, attempt, s.holder)
    started = monotonic_ms()
    if not s.leases.acquire(token):
        bound.info("message.lease_taken", holder=s.leases.holder(run_id))
        return "lease_taken"
    lease = s.heartbeat.hold(token, started)
    release = True
    try:
        if row.status == "queued":
            with s.engine.connect() as conn:
                claimed = claim_queued(conn, run_id, attempt)
            if claimed is None:
                bound.info("message.claim_lost")
                return "stale"
            row = claimed
        faults.point("after_claim")
        attempt_class = {"workflow": WorkflowRun, "job": JobRun}.get(row.kind, AgentRun)
        return attempt_class(s, row, lease).execute()
    except (FencedOut, LeaseLost) as exc:
        bound.warning("run.fenced_out", why=str(exc))
        return "fenced"
    except Exception:
        # Unexpected (a bug, a database outage): behave as a crash. Keep the lease so it
        # lapses and the sweeper resumes the run from its checkpoint elsewhere.
        release = False
        bound.exception("run.error")
        return "error"
    finally:
        s.heartbeat.drop(lease)
        if release:
            try:
                s.leases.release(token)
            except Exception:  # the lease lapses by itself
                bound.warning("lease.release_failed")
