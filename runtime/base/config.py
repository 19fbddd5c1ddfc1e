"""The error every setting reader raises: a missing or malformed setting, named.

Its own module so the readers of each kind of setting (`settings.py`, `store_urls.py`) share it
without importing each other.
"""

from __future__ import annotations

from store.errors import LiyagentError


class ConfigError(LiyagentError, ValueError):
    """A setting is missing or malformed; the message names the variable to fix."""
