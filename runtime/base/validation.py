"""What pydantic found wrong with a value, worded once for every error that names it."""

from __future__ import annotations

import pydantic


def problems(exc: pydantic.ValidationError, whole: str) -> list[tuple[str, str]]:
    """Each problem as (dotted field, message); `whole` names the value itself (a problem at
    its top level has no field)."""
    return [
        (".".join(str(p) for p in e["loc"]) or whole, e["msg"])
        for e in exc.errors(include_url=False)
    ]


def described(exc: pydantic.ValidationError, whole: str) -> str:
    """The problems in one line: `field: message; field: message`."""
    return "; ".join(f"{field}: {message}" for field, message in problems(exc, whole))
