"""A small order-desk MCP server built with the official SDK, for the MCP tool tests.

`python -m tests.support.mcp_server --record FILE [--token-env VAR] [--slow TOOL=MS]
[--fail TOOL=STATUS:TIMES]` serves streamable HTTP on a free loopback port and prints
`mcp server listening on http://127.0.0.1:PORT/mcp`. Every `tools/call` it receives is appended
to FILE (one JSON line, flushed and fsynced before the tool acts), with the Idempotency-Key
header, the key in `_meta` and the run headers: its own records judge what the engine did.

- `lookup_order` is annotated read-only; `refund_order` has no annotations (a plain write);
  `open_case` says only `idempotentHint` (still a write, unless the operator says it is keyed)
  and dedupes on the Idempotency-Key header: a key seen before returns the same case.
- `--slow TOOL=MS` makes a tool wait after it is recorded, so a test can kill a worker while
  the call is in flight. `--fail TOOL=STATUS:TIMES` answers STATUS instead of the tool's result
  the first TIMES calls, after the tool acted (the effect lands, the answer is lost).
- `--token-env VAR` requires `Authorization: Bearer <$VAR>` (401 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

Scope = dict[str, Any]
ASGI = Any


class Desk:
    """The server's state and its records."""

    def __init__(self, record: Path, slow: dict[str, int]) -> None:
        self.record = record
        self.slow = slow
        self.cases: dict[str, dict[str, Any]] = {}
        self.refunds = 0

    def note(self, tool: str, args: dict[str, Any], ctx: Context, deduped: bool = False) -> None:
        headers = {k.lower(): v for k, v in (ctx.headers or {}).items()}
        meta = dict(ctx.request_context.meta or {})
        line = {
            "tool": tool,
            "args": args,
            "idem_key": headers.get("idempotency-key"),
            "meta_key": meta.get("liyagent/idempotency_key"),
            "run_id": headers.get("x-liyagent-run"),
            "attempt": headers.get("x-liyagent-attempt"),
            "auth": headers.get("authorization"),
            "deduped": deduped,
        }
        with self.record.open("a") as fh:
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    async def pause(self, tool: str) -> None:
        if tool in self.slow:
            await anyio.sleep(self.slow[tool] / 1000)


def build(desk: Desk) -> MCPServer:
    app = MCPServer("orders")

    @app.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def lookup_order(order_id: str, ctx: Context) -> dict[str, Any]:
        """Look an order up by its id: status, total and items."""
        desk.note("lookup_order", {"order_id": order_id}, ctx)
        await desk.pause("lookup_order")
        return {"order_id": order_id, "status": "delivered", "total_cents": 4599}

    @app.tool()
    async def refund_order(
        order_id: str, amount_cents: int, reason: str, ctx: Context
    ) -> dict[str, Any]:
        """Refund part or all of an order to the customer's card."""
        desk.note(
            "refund_order",
            {"order_id": order_id, "amount_cents": amount_cents, "reason": reason},
            ctx,
        )
        await desk.pause("refund_order")
        if amount_cents > 100_000:
            raise ToolError(f"refund of {amount_cents} cents is over the limit of 100000")
        desk.refunds += 1
        return {"refund_id": f"rf_{desk.refunds}", "order_id": order_id, "amount": amount_cents}

    @app.tool(annotations=ToolAnnotations(idempotentHint=True))
    async def open_case(order_id: str, summary: str, ctx: Context) -> dict[str, Any]:
        """Open a support case about an order (deduplicated by the Idempotency-Key header)."""
        key = {k.lower(): v for k, v in (ctx.headers or {}).items()}.get("idempotency-key")
        seen = key is not None and key in desk.cases
        desk.note("open_case", {"order_id": order_id, "summary": summary}, ctx, deduped=seen)
        await desk.pause("open_case")
        if key is not None and seen:
            return desk.cases[key]
        case = {"case_id": f"case_{len(desk.cases) + 1}", "order_id": order_id}
        if key is not None:
            desk.cases[key] = case
        return case

    return app


def guard(inner: ASGI, token_env: str | None, fail: dict[str, list[int]]) -> ASGI:
    """Auth (when asked) and armed failures around the MCP app (pure ASGI)."""

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        if token_env is not None:
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            if headers.get("authorization") != f"Bearer {os.environ.get(token_env, '')}":
                await _plain(send, 401, b"missing or wrong bearer token")
                return
        body = await _body(receive)
        armed = fail.get(_tool_of(body) or "")
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return dict(await receive())

        if not armed or armed[1] <= 0:
            await inner(scope, replay, send)
            return
        armed[1] -= 1

        async def swallow(message: dict[str, Any]) -> None:
            pass  # the tool acted; its answer is lost on the way back

        await inner(scope, replay, swallow)
        await _plain(send, armed[0], b"upstream failure")

    return app


async def _body(receive: Any) -> bytes:
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def _tool_of(body: bytes) -> str | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if isinstance(parsed, dict) and parsed.get("method") == "tools/call":
        return str((parsed.get("params") or {}).get("name"))
    return None


async def _plain(send: Any, status: int, text: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain")],
        }
    )
    await send({"type": "http.response.body", "body": text})


def _pairs(items: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", required=True, type=Path)
    parser.add_argument("--token-env")
    parser.add_argument("--slow", action="append", default=[])
    parser.add_argument("--fail", action="append", default=[])
    args = parser.parse_args()
    desk = Desk(args.record, {k: int(v) for k, v in _pairs(args.slow).items()})
    fail = {k: [int(v.split(":")[0]), int(v.split(":")[1])] for k, v in _pairs(args.fail).items()}
    mcp_app = build(desk).streamable_http_app(host="127.0.0.1", json_response=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections made before uvicorn starts wait in the backlog
    config = uvicorn.Config(
        guard(mcp_app, args.token_env, fail), log_level="warning", lifespan="on"
    )
    print(f"mcp server listening on http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
    anyio.run(uvicorn.Server(config).serve, [sock])


if __name__ == "__main__":
    main()


class Served:
    """The server as a test sees it: its URL and its own records."""

    def __init__(self, tmp: Path, name: str = "mcp", *options: str, env: dict[str, str]) -> None:
        from liyagent.local.procs import Proc, python

        self.record = tmp / f"{name}.jsonl"
        self.record.touch()
        argv = python("-m", "tests.support.mcp_server", "--record", str(self.record), *options)
        self.proc = Proc(name, argv, env, tmp / f"{name}.log")
        self.url = self.proc.wait_for(r"mcp server listening on (\S+)", timeout=30).group(1)

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        """Every tools/call the server received (of one tool), in order."""
        lines = [json.loads(line) for line in self.record.read_text().splitlines() if line]
        return [c for c in lines if tool is None or c["tool"] == tool]

    def config(self, **server: Any) -> str:
        """`LIYAGENT_MCP_SERVERS` for this server (inline JSON)."""
        return json.dumps({"servers": [{"name": "orders", "url": self.url, **server}]})

    def close(self) -> None:
        self.proc.kill()
