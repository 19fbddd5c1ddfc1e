"""Teams' settings: the bot's identity, its credentials and where it reads back, from the
`LIYAGENT_TEAMS_*` environment variables (the entry's `settings_type`, no part of the base
`Settings`), read once per process where Teams needs them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from runtime.base.settings import env_bool, env_nonnegative


@dataclass(frozen=True)
class TeamsSettings:
    """The Teams bot (Bot Framework), as the front checks its channel's tokens and the workers
    post and read back its replies."""

    # Its app id (the audience of the channel's tokens; empty refuses every activity), the
    # token issuer, the keys endpoint (JWKS) the tokens' signatures are checked against, and
    # the catalog agent that answers its turns.
    app_id: str = ""
    issuer: str = "https://api.botframework.com"
    jwks_url: str = "https://login.botframework.com/v1/.well-known/keys"
    agent: str = "teams-helper"
    # The bot's own credentials for replying through the Bot Connector (OAuth 2.0 client
    # credentials): its app password is read when a token is needed, from the file
    # `app_password_file` names (Compose secrets) or else from the environment variable
    # `app_password_env` names, never kept in the settings; the token endpoint and scope.
    app_password_env: str = "LIYAGENT_TEAMS_APP_PASSWORD"
    app_password_file: str = ""
    token_url: str = "https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token"
    token_scope: str = "https://api.botframework.com/.default"
    # Before a resumed hand-on posts a turn's reply, read the conversation back through
    # Microsoft Graph for a reply carrying the run's key (the Bot Connector lists nothing); off
    # posts without looking (docs/teams.md says what each leaves open). Graph is asked with the
    # bot's own app-only token (client credentials at the tenant's token endpoint, `{tenant}`
    # being the activity's tenant id); an empty read is trusted only once `graph_settle_ms`
    # has passed since the hand-on began (Graph's lag after a post).
    read_back: bool = True
    graph_url: str = "https://graph.microsoft.com/v1.0"
    graph_token_url: str = "https://login.microsoftonline.com/{tenant}/oauth2/v2.0/token"
    graph_scope: str = "https://graph.microsoft.com/.default"
    graph_settle_ms: int = 5000
    # The Teams app's manifest id (its catalog entry's externalId), by which Graph finds the
    # app's installation for a person and so their personal chat with the bot; empty: the
    # bot's app id (an app whose manifest reuses it).
    manifest_id: str = ""

    @classmethod
    def from_env(cls) -> TeamsSettings:
        """The settings the `LIYAGENT_TEAMS_*` variables give (a bad value: `ConfigError`)."""
        env = os.environ.get
        return cls(
            app_id=env("LIYAGENT_TEAMS_APP_ID", "").strip(),
            issuer=env("LIYAGENT_TEAMS_ISSUER") or cls.issuer,
            jwks_url=env("LIYAGENT_TEAMS_JWKS_URL") or cls.jwks_url,
            agent=env("LIYAGENT_TEAMS_AGENT") or cls.agent,
            app_password_env=env("LIYAGENT_TEAMS_APP_PASSWORD_ENV") or cls.app_password_env,
            app_password_file=env("LIYAGENT_TEAMS_APP_PASSWORD_FILE", "").strip(),
            token_url=env("LIYAGENT_TEAMS_TOKEN_URL") or cls.token_url,
            token_scope=env("LIYAGENT_TEAMS_TOKEN_SCOPE") or cls.token_scope,
            read_back=env_bool("LIYAGENT_TEAMS_READ_BACK", cls.read_back),
            graph_url=(env("LIYAGENT_TEAMS_GRAPH_URL") or cls.graph_url).rstrip("/"),
            graph_token_url=env("LIYAGENT_TEAMS_GRAPH_TOKEN_URL") or cls.graph_token_url,
            graph_scope=env("LIYAGENT_TEAMS_GRAPH_SCOPE") or cls.graph_scope,
            graph_settle_ms=env_nonnegative("LIYAGENT_TEAMS_GRAPH_SETTLE_MS", cls.graph_settle_ms),
            manifest_id=env("LIYAGENT_TEAMS_MANIFEST_ID", "").strip(),
        )


@lru_cache(maxsize=1)
def teams_settings() -> TeamsSettings:
    """This process's Teams settings (tests that change the environment clear this cache)."""
    return TeamsSettings.from_env()
