"""What every engine process checks before it takes any work: its settings, its seal keys and
its tools. A process that would fail every task instead refuses to start, saying what to fix."""

from __future__ import annotations

from runtime.redis_clients import check_reachable
from runtime.sealing import load_sealer
from runtime.services import registry_for
from runtime.settings import ConfigError, Settings, get_settings
from runtime.tools import ToolDeclarationError


class StartupRefused(Exception):
    """This process must not start; the message says what to fix."""


def check(settings: Settings | None = None) -> Settings:
    """The settings, with seal keys and tools loaded; raises StartupRefused otherwise."""
    try:
        settings = settings or get_settings()
        load_sealer(settings.production)
        registry_for(settings)
        check_reachable(settings)  # Sentinels that answer and know the master
    except (ConfigError, ToolDeclarationError) as exc:
        raise StartupRefused(str(exc)) from None
    return settings
