"""Erasure endpoints: delete a run's content (or every run of an owner) at once, keeping a
tombstone. They need the `erase` right; who erased is the token's principal, audited."""

from __future__ import annotations

import structlog
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from front.auth import Right, actor, requires, services
from front.body import Fields, path_uuid, read_json
from front.errors import FrontError
from runtime.entries.client import Client
from runtime.ops.erasure import Erased, OwnerNotFound
from runtime.services import Services

log = structlog.get_logger("front")


def _erase(s: Services, by: str, **target: str) -> Erased:
    """Erase the run or the owner's runs; an owner without runs is a 404 (an unknown run is
    too, through RunNotFound's handler)."""
    try:
        return Client(s).erase(by=by, **target)
    except OwnerNotFound as exc:
        raise FrontError(404, str(exc)) from None


async def _erase_response(request: Request, **target: str) -> Response:
    body = await read_json(request)
    by = actor(request, body)
    Fields(body, set())
    done = await run_in_threadpool(_erase, services(request), by, **target)
    log.info("front.erased", by=by, runs=[i for i, _ in done.runs], stopped=done.stopped)
    return JSONResponse(done.to_json())


@requires(Right.ERASE)
async def run_erase(request: Request) -> Response:
    """POST /runs/{run_id}/erase {}: erase the run and its sub-agent runs; one not finished is
    stopped first and its attempt fenced out."""
    run_id = path_uuid(request.path_params["run_id"], "run id")
    return await _erase_response(request, run_id=run_id)


@requires(Right.ERASE)
async def owner_erase(request: Request) -> Response:
    """POST /owners/{owner}/erase {}: erase every run of the owner, as for one run (a Teams
    person is named by their Entra object id, never a display name: `runtime/ops/erasure.py`)."""
    return await _erase_response(request, owner=request.path_params["owner"])
