"""Run endpoints: read a run, stop it (or an agent), lift a stop, decide an approval it waits
on; and the health check a load balancer polls (the one endpoint without a token). Who stops,
lifts or decides is the principal of the request's bearer token (front/auth.py)."""

from __future__ import annotations

import structlog
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from front.auth import Right, actor, principal, protected, requires, seen_run, services
from front.body import Fields, path_id, path_uuid, read_json
from front.errors import FrontError
from runtime.entries.client import AGENT_NAME, Client, NotDecided, Stopped, UnknownAgent
from runtime.services import Services
from store import db
from store.rows import ApprovalRow, StopRow

log = structlog.get_logger("front")

MAX_REASON_BYTES = 4096


@protected
async def run_read(request: Request) -> Response:
    """GET /runs/{run_id}: status, attempt, losses, step, answer, failure and what it waits on;
    only for the principal that started the run, or an operator (404 otherwise)."""
    run_id = path_uuid(request.path_params["run_id"], "run id")
    await seen_run(request, run_id)
    view = await run_in_threadpool(Client(services(request)).get, run_id)
    return JSONResponse(view.to_json())


def _stop(s: Services, run_id: str, by: str, reason: str) -> bool:
    """Stop one existing run (404 for an unknown id); True if it was failed at once."""
    return run_id in Client(s).stop_run(run_id, reason=reason, by=by).now


@requires(Right.STOP)
async def run_stop(request: Request) -> Response:
    """POST /runs/{run_id}/stop {"reason"}: the run, its children and theirs fail now (a
    running attempt is fenced out). Who stops is the token's principal."""
    run_id = path_uuid(request.path_params["run_id"], "run id")
    body = await read_json(request)
    by = actor(request, body)
    reason = Fields(body, {"reason"}).text("reason", MAX_REASON_BYTES)
    now = await run_in_threadpool(_stop, services(request), run_id, by, reason)
    log.info("front.run_stopped", run_id=run_id, by=by, stopped_now=now)
    return JSONResponse({"run_id": run_id, "stopped_now": now, "by": by}, status_code=202)


@requires(Right.START)
async def run_signal(request: Request) -> Response:
    """POST /runs/{run_id}/signal {"name", "payload"?, "key"?}: send the run a signal (taken
    exactly once; the same key sends nothing more), for a run the principal may see that has
    not ended (404 for one it may not see, 400 for one that ended; nothing stored)."""
    run_id = path_uuid(request.path_params["run_id"], "run id")
    body = await read_json(request)
    by = actor(request, body)
    fields = Fields(body, {"name", "payload", "key"})
    name, key = fields.name("name"), fields.optional_ident("key")
    scope = principal(request).scope()
    client = Client(services(request))
    await seen_run(request, run_id)
    signal_id = await run_in_threadpool(
        lambda: client.signal(run_id, name, body.get("payload"), key=key, by=by, scope=scope)
    )
    log.info("front.run_signalled", run_id=run_id, by=by, signal=name)
    return JSONResponse({"run_id": run_id, "signal": name, "signal_id": signal_id}, status_code=202)


def _stop_agent(s: Services, agent: str, by: str, reason: str) -> Stopped:
    """Stop an agent's runs; 404 for an agent neither in the catalog nor with runs."""
    try:
        return Client(s).stop_agent(agent, reason=reason, by=by)
    except UnknownAgent as exc:
        raise FrontError(404, str(exc)) from None


@requires(Right.STOP)
async def agent_stop(request: Request) -> Response:
    """POST /agents/{agent}/stop {"reason"}: every run of the agent, and its later runs until
    the stop is lifted."""
    agent = path_id(request.path_params["agent"], "agent", AGENT_NAME)
    body = await read_json(request)
    by = actor(request, body)
    reason = Fields(body, {"reason"}).text("reason", MAX_REASON_BYTES)
    done = await run_in_threadpool(_stop_agent, services(request), agent, by, reason)
    log.info("front.agent_stopped", agent=agent, by=by, stopped_now=len(done.now))
    return JSONResponse(
        {"agent": agent, "stopped_now": done.now, "by": by},
        status_code=202,
    )


def _lift(s: Services, by: str, reason: str | None, **target: str) -> list[StopRow]:
    """Lift the stops on a run or agent; 404 when none stands."""
    lifted = Client(s).lift_stop(by=by, reason=reason, **target)
    if not lifted:
        what = " ".join(f"{k.replace('_id', '')} {v}" for k, v in target.items())
        raise FrontError(404, f"no stop stands on {what}; nothing was lifted")
    return lifted


async def _lift_response(request: Request, **target: str) -> Response:
    body = await read_json(request)
    by = actor(request, body)
    reason = Fields(body, {"reason"}).optional_text("reason", MAX_REASON_BYTES)
    lifted = await run_in_threadpool(_lift, services(request), by, reason, **target)
    log.info("front.stop_lifted", by=by, stops=[x.id for x in lifted], **target)
    return JSONResponse({**target, "lifted": [x.id for x in lifted], "by": by})


@requires(Right.STOP)
async def run_stop_lift(request: Request) -> Response:
    """POST /runs/{run_id}/stop/lift {"reason"?}: lift the stops on one run, audited."""
    run_id = path_uuid(request.path_params["run_id"], "run id")
    return await _lift_response(request, run_id=run_id)


@requires(Right.STOP)
async def agent_stop_lift(request: Request) -> Response:
    """POST /agents/{agent}/stop/lift {"reason"?}: lift the stops on an agent, audited; its
    runs are no longer refused."""
    agent = path_id(request.path_params["agent"], "agent", AGENT_NAME)
    return await _lift_response(request, agent=agent)


def _decide(
    s: Services, approval_id: str, approve: bool, by: str, reason: str | None
) -> ApprovalRow:
    """Decide once: an unknown approval is 404, one already decided 409 (nothing changes)."""
    try:
        return Client(s).decide(approval_id, approve=approve, by=by, reason=reason)
    except NotDecided as exc:
        current = exc.current
        if current is None:
            raise FrontError(404, str(exc)) from None
        raise FrontError(409, str(exc), run_id=current.run_id, decided=current.status) from None


@requires(Right.DECIDE)
async def approval_decision(request: Request) -> Response:
    """POST /approvals/{approval_id}/decision {"approve", "reason"?}: who decides is the
    token's principal."""
    approval_id = path_uuid(request.path_params["approval_id"], "approval id")
    body = await read_json(request)
    by = actor(request, body)
    f = Fields(body, {"approve", "reason"})
    approve = f.flag("approve")
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
