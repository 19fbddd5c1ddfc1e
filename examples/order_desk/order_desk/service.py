"""The order desk's backend: a small HTTP service with its own SQLite records.

    python -m order_desk.service --port 8790 --db order_desk.sqlite

It keeps orders, refunds, notes and customer emails, and records every request it receives
(method, path, Idempotency-Key, the run and attempt headers, body, status, whether it was a
duplicate) in the `requests` table, so what an agent did is judged from the desk's own records.

- `GET  /orders/{id}`: an order.
- `POST /refunds`: issue a refund; needs an `Idempotency-Key` header and dedupes on it for 24
  hours (the same key answers the refund it made, and creates nothing).
- `POST /orders/{id}/notes`, `GET /orders/{id}/notes?idempotency_key=K`: add a note; find the
  note a key made (how a write with a reader is read back).
- `POST /emails`: email a customer (no key, no lookup: a plain write).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

DEDUPE_WINDOW_S = 24 * 3600
SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY, at REAL, method TEXT, path TEXT, idem_key TEXT, run_id TEXT,
    attempt TEXT, body TEXT, status INTEGER, deduped INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS orders (
    id TEXT PRIMARY KEY, customer TEXT, email TEXT, total_cents INTEGER, status TEXT);
CREATE TABLE IF NOT EXISTS refunds (
    id INTEGER PRIMARY KEY, at REAL, order_id TEXT, amount_cents INTEGER, reason TEXT,
    idem_key TEXT UNIQUE);
CREATE TABLE IF NOT EXISTS notes (
    id INTEGER PRIMARY KEY, at REAL, order_id TEXT, text TEXT, idem_key TEXT);
CREATE TABLE IF NOT EXISTS emails (
    id INTEGER PRIMARY KEY, at REAL, order_id TEXT, to_addr TEXT, subject TEXT, body TEXT,
    idem_key TEXT);
"""
ORDERS = [
    ("A-1001", "Dana Reyes", "dana@example.com", 4599, "delivered"),
    ("A-1002", "Sam Okafor", "sam@example.com", 12900, "shipped"),
    ("A-1003", "Lee Chen", "lee@example.com", 2350, "delivered"),
]

Reply = tuple[int, dict[str, Any], bool]  # status, body, deduped
Handler = Callable[[Request, dict[str, Any], sqlite3.Connection], Reply]


def connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")  # readers (a test, an operator) never block the desk
    db.executescript(SCHEMA)
    db.executemany("INSERT OR IGNORE INTO orders VALUES (?, ?, ?, ?, ?)", ORDERS)
    return db


def get_order(request: Request, body: dict[str, Any], db: sqlite3.Connection) -> Reply:
    row = db.execute("SELECT * FROM orders WHERE id = ?", (request.path_params["id"],)).fetchone()
    if row is None:
        return 404, {"error": f"no order {request.path_params['id']}"}, False
    return 200, _order(row), False


def create_refund(request: Request, body: dict[str, Any], db: sqlite3.Connection) -> Reply:
    key = request.headers.get("idempotency-key")
    if not key:
        return 400, {"error": "refunds need an Idempotency-Key header"}, False
    earlier = db.execute(
        "SELECT * FROM refunds WHERE idem_key = ? AND at > ?", (key, time.time() - DEDUPE_WINDOW_S)
    ).fetchone()
    if earlier is not None:
        return 200, _refund(earlier), True
    order = db.execute("SELECT * FROM orders WHERE id = ?", (body.get("order_id"),)).fetchone()
    amount = body.get("amount_cents")
    if order is None or not isinstance(amount, int) or not 0 < amount <= order["total_cents"]:
        return 422, {"error": "unknown order, or an amount not within its total"}, False
    cursor = db.execute(
        "INSERT INTO refunds (at, order_id, amount_cents, reason, idem_key) VALUES (?, ?, ?, ?, ?)",
        (time.time(), order["id"], amount, str(body.get("reason") or ""), key),
    )
    row = db.execute("SELECT * FROM refunds WHERE id = ?", (cursor.lastrowid,)).fetchone()
    return 201, _refund(row), False


def add_note(request: Request, body: dict[str, Any], db: sqlite3.Connection) -> Reply:
    order_id = request.path_params["id"]
    cursor = db.execute(
        "INSERT INTO notes (at, order_id, text, idem_key) VALUES (?, ?, ?, ?)",
        (
            time.time(),
            order_id,
            str(body.get("text") or ""),
            request.headers.get("idempotency-key"),
        ),
    )
    return 201, {"note_id": cursor.lastrowid, "order_id": order_id, "text": body.get("text")}, False


def find_notes(request: Request, body: dict[str, Any], db: sqlite3.Connection) -> Reply:
    rows = db.execute(
        "SELECT * FROM notes WHERE order_id = ? AND idem_key = ? ORDER BY id",
        (request.path_params["id"], request.query_params.get("idempotency_key")),
    ).fetchall()
    notes = [{"note_id": r["id"], "order_id": r["order_id"], "text": r["text"]} for r in rows]
    return 200, {"notes": notes}, False


def send_email(request: Request, body: dict[str, Any], db: sqlite3.Connection) -> Reply:
    order = db.execute("SELECT * FROM orders WHERE id = ?", (body.get("order_id"),)).fetchone()
    if order is None:
        return 422, {"error": f"no order {body.get('order_id')}"}, False
    cursor = db.execute(
        "INSERT INTO emails (at, order_id, to_addr, subject, body, idem_key) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (
            time.time(),
            order["id"],
            order["email"],
            str(body.get("subject") or ""),
            str(body.get("body") or ""),
            request.headers.get("idempotency-key"),
        ),
    )
    return 201, {"email_id": cursor.lastrowid, "to": order["email"]}, False


def _order(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "order_id": row["id"],
        "customer": row["customer"],
        "email": row["email"],
        "total_cents": row["total_cents"],
        "status": row["status"],
    }


def _refund(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "refund_id": row["id"],
        "order_id": row["order_id"],
        "amount_cents": row["amount_cents"],
    }


def recorded(db: sqlite3.Connection, handler: Handler, delay_s: float) -> Any:
    """Run one request in a transaction with its record in `requests`."""

    async def endpoint(request: Request) -> JSONResponse:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        if request.method != "GET" and delay_s:
            await asyncio.sleep(delay_s)  # a slower desk, so a person can kill a worker mid-run
        db.execute("BEGIN IMMEDIATE")
        try:
            status, payload, deduped = handler(request, body, db)
            db.execute(
                "INSERT INTO requests (at, method, path, idem_key, run_id, attempt, body, status,"
                " deduped) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    request.method,
                    request.url.path,
                    request.headers.get("idempotency-key"),
                    request.headers.get("x-liyagent-run"),
                    request.headers.get("x-liyagent-attempt"),
                    raw.decode(errors="replace"),
                    status,
                    int(deduped),
                ),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return JSONResponse(payload, status_code=status)

    return endpoint


def app(db: sqlite3.Connection, delay_s: float = 0.0) -> Starlette:
    def route(path: str, handler: Handler, method: str) -> Route:
        return Route(path, recorded(db, handler, delay_s), methods=[method])

    return Starlette(
        routes=[
            route("/orders/{id}", get_order, "GET"),
            route("/refunds", create_refund, "POST"),
            route("/orders/{id}/notes", add_note, "POST"),
            route("/orders/{id}/notes", find_notes, "GET"),
            route("/emails", send_email, "POST"),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="The order desk's HTTP service.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8790, help="0 picks a free port")
    parser.add_argument("--db", type=Path, default=Path("order_desk.sqlite"))
    parser.add_argument("--delay-ms", type=int, default=0, help="added to every write")
    args = parser.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(128)
    service = app(connect(args.db), args.delay_ms / 1000)
    config = uvicorn.Config(service, log_level="warning", lifespan="off")
    host, port = sock.getsockname()[:2]
    print(f"order desk listening on http://{host}:{port} (records in {args.db})", flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
