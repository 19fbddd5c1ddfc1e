"""A team's asyncio web app (Starlette, which FastAPI is built on) that starts liyagent runs
from its handlers: the client is made lazily, inside the running loop, on the first request, as
a FastAPI app does; its process loads the modules `LIYAGENT_TOOLS` names (framework agents among
them) then. Each handler starts a declared agent's run, waits for its end without blocking the
loop, and answers what the app read of it.

    python -m tests.support.asgi_app --port 0   # prints "app listening on http://HOST:PORT"
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import liyagent

WAIT_S = 90.0


async def start_with_client(request: Request) -> JSONResponse:
    """`liyagent.client()` called in an async handler (a synchronous start inside the loop)."""
    body = await request.json()
    run_id = liyagent.client().start_agent(body["agent"], body["input"])
    return await _finished(run_id)


async def start_with_aclient(request: Request) -> JSONResponse:
    """`liyagent.aclient()`: the start awaited."""
    body = await request.json()
    run_id = await liyagent.aclient().start_agent(body["agent"], body["input"])
    return await _finished(run_id)


async def _finished(run_id: str) -> JSONResponse:
    """What the app read: the run's status, its output's JSON, and the type `output` has in
    this process (which declares the agents) with a field read from it."""
    view = await liyagent.aclient().wait(run_id, timeout_s=WAIT_S)
    typed = view.output
    return JSONResponse(
        {
            "run_id": run_id,
            "status": view.status,
            "output": view.output_json,
            "type": f"{type(typed).__module__}.{type(typed).__name__}",
            "order_id": getattr(typed, "order_id", None),
        }
    )


app = Starlette(
    routes=[
        Route("/client", start_with_client, methods=["POST"]),
        Route("/aclient", start_with_aclient, methods=["POST"]),
    ]
)


def main() -> None:
    parser = argparse.ArgumentParser(description="A team's asyncio app starting liyagent runs.")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", args.port))
    sock.listen(64)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    print(f"app listening on http://{host}:{port}", flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
