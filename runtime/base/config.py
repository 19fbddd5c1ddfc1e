"""The error every setting reader raises: a missing or malformed setting, named.

Its own module so the readers of each kind of setting (`settings.py`, `store_urls.py`) share it
without importing each other.
"""

from __future__ import annotations

from pathlib import Path

from store.errors import LiyagentError


class ConfigError(LiyagentError, ValueError):
    """A setting is missing or malformed; the message names the variable to fix."""


def json_setting(setting: str, raw: str) -> str:
    """A JSON setting's text: the value itself, or the file an `@path` value names (ConfigError
    naming `setting` and the file when it cannot be read)."""
    raw = raw.strip()
    if not raw.startswith("@"):
        return raw
    try:
        return Path(raw[1:]).read_text()
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {raw[1:]} ({exc.strerror})") from None
