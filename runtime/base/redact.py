"""What of an exception may reach a log line or an audit row: never its message.

An exception's message can carry user text: a database error quotes the value it refused
(`invalid input syntax for type integer: "<the user's text>"`, `Key (k)=(<value>) already
exists`) even with the engine's `hide_parameters`, and a tool's own error can hold anything.
Operators get instead the exception's type, a database error's SQLSTATE and the schema names
it involves (a constraint, a table, a column: ours, never user data), and where it was raised
(code locations only, no values).
"""

from __future__ import annotations

import traceback
from typing import Any

# Frames kept from the innermost outwards: enough to find the failing call site.
FRAMES = 12


def _database_error(exc: BaseException) -> Any:
    """The driver's error under a SQLAlchemy wrapper (or the exception itself), if it has a
    SQLSTATE."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "sqlstate", None):
            return current
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return None


def error_facts(exc: BaseException) -> dict[str, Any]:
    """The exception's type, SQLSTATE and schema names (database errors), and the innermost
    code location: safe for logs and audit rows, since no message or value is included."""
    facts: dict[str, Any] = {"error": type(exc).__name__}
    db_error = _database_error(exc)
    if db_error is not None:
        facts["sqlstate"] = str(db_error.sqlstate)
        facts["db_error"] = type(db_error).__name__
        diag = getattr(db_error, "diag", None)
        for name in ("constraint_name", "table_name", "column_name"):
            value = getattr(diag, name, None)
            if value:
                facts[name] = str(value)
    stack = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in stack if "site-packages" not in f.filename] or stack
    if ours:
        last = ours[-1]  # the innermost frame outside libraries: the call that failed
        facts["where"] = f"{last.filename}:{last.lineno} in {last.name}"
    facts["message"] = "withheld: it may carry user text"
    return facts


def frames(exc: BaseException) -> list[str]:
    """Where the exception went through (file, line, function and the line's code), innermost
    last: the traceback without the exception's message."""
    stack = traceback.extract_tb(exc.__traceback__)[-FRAMES:]
    return [f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}" for f in stack]
