"""Run endpoints: read a run, stop it, decide an approval it waits on; and the health check
a load balancer polls (the one endpoint without a token)."""

from __future__ import annotations

import dataclasses

import structlog
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from front.auth import protected, services
from front.body import Fields, path_uuid, read_json
from front.errors import FrontError
from runtime.client import Client
from runtime.enqueue import BadRequest
from runtime.services import Services
from store import db
from store.rows import ApprovalRow
from store.waits import get_approval

log = structlog.get_logger("front")

MAX_REASON_BYTES = 4096


@protected
async def run_read(request: Request) -> Response:
    """GET /runs/{run_id}: status, attempt, losses, step, answer, failure and what it waits on."""
    run_id = path_uuid(request.path_params["run_id"], "run id")
    view = await run_in_threadpool(Client(services(request)).get, run_id)
    return JSONResponse(dataclasses.asdict(view))


def _stop(s: Services, run_id: str, by: str, reason: str) -> bool:
    """Stop one existing run (404 for an unknown id); True if it was failed at once."""
    client = Client(s)
    client.get(run_id)
    return run_id in client.stop(run_id=run_id, reason=reason, by=by)


@protected
async def run_stop(request: Request) -> Response:
    """POST /runs/{run_id}/stop {"by", "reason"}: queued and waiting runs fail now, running
    ones at their next step."""
    run_id = path_uuid(request.path_params["run_id"], "run id")
    f = Fields(await read_json(request), {"by", "reason"})
    by, reason = f.name("by"), f.text("reason", MAX_REASON_BYTES)
    now = await run_in_threadpool(_stop, services(request), run_id, by, reason)
    log.info("front.run_stopped", run_id=run_id, by=by, stopped_now=now)
    return JSONResponse({"run_id": run_id, "stopped_now": now}, status_code=202)


def _decide(
    s: Services, approval_id: str, approve: bool, by: str, reason: str | None
) -> ApprovalRow:
    """Decide once: an unknown approval is 404, one already decided 409 (nothing changes)."""
    try:
        return Client(s).decide(approval_id, approve=approve, by=by, reason=reason)
    except BadRequest as exc:
        with s.engine.connect() as conn:
            current = get_approval(conn, approval_id)
        if current is None:
            raise FrontError(404, str(exc)) from None
        raise FrontError(409, str(exc), run_id=current.run_id, decided=current.status) from None


@protected
async def approval_decision(request: Request) -> Response:
    """POST /approvals/{approval_id}/decision {"approve", "by", "reason"?}."""
    approval_id = path_uuid(request.path_params["approval_id"], "approval id")
    f = Fields(await read_json(request), {"approve", "by", "reason"})
    approve, by = f.flag("approve"), f.name("by")
    reason = f.optional_text("reason", MAX_REASON_BYTES)
    row = await run_in_threadpool(_decide, services(request), approval_id, approve, by, reason)
    log.info("front.approval_decided", run_id=row.run_id, approval_id=row.id, status=row.status)
    return JSONResponse(
        {"id": row.id, "status": row.status, "decided_by": row.decided_by, "run_id": row.run_id}
    )


def _down(s: Services) -> list[str]:
    """What is unreachable now: Postgres (a trivial query) and Redis (PING)."""
    down: list[str] = []
    try:
        db.ping(s.engine)
    except Exception as exc:
        down.append(f"postgres ({type(exc).__name__}; check LIYAGENT_DATABASE_URL)")
    try:
        s.redis.ping()
    except Exception as exc:
        down.append(f"redis ({type(exc).__name__}; check LIYAGENT_REDIS_URL)")
    return down


async def healthz(request: Request) -> Response:
    """GET /healthz: 200 when Postgres and Redis answer, 503 naming what is down."""
    down = await run_in_threadpool(_down, services(request))
    if down:
        log.warning("front.unhealthy", down=down)
        return JSONResponse({"ok": False, "error": "down: " + ", ".join(down)}, status_code=503)
    return JSONResponse({"ok": True})
