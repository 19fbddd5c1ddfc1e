"""Secrets a local tool (the demo) makes for its user: kept in a file only that user can read,
and shown on the terminal masked, never in clear (a terminal is scrolled back, recorded,
shared on a call and pasted into issues; issue 31)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# The characters of a secret shown: enough to tell two apart, too few to use one.
SHOWN = 4


def masked(secret: str) -> str:
    """A secret as it may be printed: its first characters and its length, nothing more."""
    return f"{secret[:SHOWN]}… ({len(secret)} characters)"


def write_secrets(path: Path, values: dict[str, str]) -> Path:
    """Write `values` to a new file at `path` that only this user can read or write (0600,
    made so when it is created, never widened after), as shell assignments: `. FILE` (after
    `set -a`: exported) sets them. Refuses to overwrite a file that exists."""
    lines = [
        "# Secrets the liyagent demo made for this deployment; readable by you alone.",
        *(f"{name}={shlex.quote(value)}" for name, value in values.items()),
    ]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def url_shown(url: str) -> str:
    """A Redis URL (or a `;`-separated list of Sentinel URLs) with any password masked."""
    return ";".join(_one_shown(part) for part in url.split(";"))


def _one_shown(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
