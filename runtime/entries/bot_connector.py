"""The Teams bot's side of the Bot Connector: its own bearer token, and requests that carry it.

A real tenant refuses a reply that does not carry the bot's token. The token comes from the
OAuth 2.0 client-credentials flow: the bot's app id (`LIYAGENT_TEAMS_APP_ID`) and app password
(read when needed from `LIYAGENT_TEAMS_APP_PASSWORD_FILE`, or from the environment variable
`LIYAGENT_TEAMS_APP_PASSWORD_ENV` names, `LIYAGENT_TEAMS_APP_PASSWORD` by default) are posted
to the token endpoint (`LIYAGENT_TEAMS_TOKEN_URL`) for the connector's scope
(`LIYAGENT_TEAMS_TOKEN_SCOPE`). The token is kept per process until shortly before it expires
(a tenth of its lifetime, at most five minutes, early), and the request for it goes through
this process's guarded client (`http.py`), so an attempt that lost its lease sends nothing.

Every connector request carries `Authorization: Bearer <token>`. A 401 from the connector means
it refused the token and did nothing, so the token is fetched again once and the request sent
once more: a refused token is not a refused reply. A second 401 is a definite refusal.

A token endpoint that cannot be reached, times out, or answers 5xx or 429 leaves the reply in
doubt (`ToolInDoubt`: the attempt ends as a crash does and a later attempt reads the reply back
and posts it); one that refuses the credentials (4xx) is a definite refusal (`ToolError`) that
names the settings to fix.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import structlog

from runtime.base.settings import Settings
from runtime.sending import http
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.tools import ToolError, ToolInDoubt

log = structlog.get_logger(__name__)

# A token is given up this long (or a tenth of its lifetime, if shorter) before it expires.
REFRESH_BEFORE_S = 300.0


@dataclass(frozen=True)
class _Token:
    value: str
    # Monotonic time after which the token is fetched again.
    use_until: float


@dataclass(frozen=True)
class TokenSource:
    """Where the bot's token for one service comes from: the token endpoint, the scope asked
    for, and how to name both in an error (the settings that choose them)."""

    url: str
    scope: str
    what: str
    settings_named: str


def connector_tokens(settings: Settings) -> TokenSource:
    """The Bot Connector's: Microsoft's `botframework.com` endpoint (or the setting's)."""
    url = settings.teams_token_url
    return TokenSource(
        url,
        settings.teams_token_scope,
        f"the Bot Framework token endpoint {url} (LIYAGENT_TEAMS_TOKEN_URL)",
        "LIYAGENT_TEAMS_APP_ID, the bot's app password and LIYAGENT_TEAMS_TOKEN_SCOPE",
    )


_lock = threading.Lock()
# (process, token URL, app id, scope) -> the token in use.
_tokens: dict[tuple[int, str, str, str], _Token] = {}


def bot_token(
    settings: Settings,
    headers: dict[str, str],
    timeout_s: float,
    *,
    refused: str | None = None,
    source: TokenSource | None = None,
) -> str:
    """The bot's bearer token for a service (the Bot Connector unless `source` names another):
    the one this process holds while it is not about to expire, else a new one from the token
    endpoint. `refused` is a token the service has just answered 401 to: it is replaced (once,
    however many requests saw it refused)."""
    source = source or connector_tokens(settings)
    key = (os.getpid(), source.url, settings.teams_app_id, source.scope)
    with _lock:
        held = _tokens.get(key)
        if held is not None and held.value != refused and time.monotonic() < held.use_until:
            return held.value
        fresh = _fetch(settings, source, headers, timeout_s)
        _tokens[key] = fresh
        return fresh.value


def app_password(settings: Settings) -> str:
    """The bot's app password, read now; `ToolError` naming the setting when there is none."""
    path = settings.teams_app_password_file
    if path:
        where = f"the file {path} (LIYAGENT_TEAMS_APP_PASSWORD_FILE)"
        try:
            value = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise ToolError(f"the bot's app password cannot be read from {where}: {exc}") from None
    else:
        where = f"the environment variable {settings.teams_app_password_env}"
        value = os.environ.get(settings.teams_app_password_env, "")
    if not value:
        raise ToolError(
            f"the Teams bot has no app password to authenticate its replies with; put it in "
            f"{where} on the workers (LIYAGENT_TEAMS_APP_PASSWORD_ENV or "
            "LIYAGENT_TEAMS_APP_PASSWORD_FILE choose where it is read from)"
        )
    return value


def _fetch(
    settings: Settings, source: TokenSource, headers: dict[str, str], timeout_s: float
) -> _Token:
    """A new token from the token endpoint (client credentials)."""
    if not settings.teams_app_id:
        raise ToolError(
            "the workers have no Teams bot to authenticate replies as; set "
            "LIYAGENT_TEAMS_APP_ID (and the bot's app password) on them"
        )
    url = source.url
    form = {
        "grant_type": "client_credentials",
        "client_id": settings.teams_app_id,
        "client_secret": app_password(settings),
        "scope": source.scope,
    }
    what = source.what
    later = "the reply is in doubt and a later attempt reads it back and posts it"
    sent = time.monotonic()
    try:
        with http.total_timeout(timeout_s):
            response = http.shared_client().post(url, data=form, headers=headers, timeout=timeout_s)
    except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise ToolInDoubt(f"{what} cannot be reached now ({why}); {later}") from exc
    except httpx.HTTPError as exc:
        raise ToolError(f"{what} cannot be asked ({exc}); fix the setting") from None
    status = response.status_code
    if status >= 500 or status == 429:
        raise ToolInDoubt(f"{what} answered {status}; {later}")
    if status >= 400:
        raise ToolError(
            f"{what} refused the bot's credentials ({status} {_oauth_error(response)}); check "
            f"{source.settings_named}",
            status,
        )
    token, lifetime = _granted(response)
    if token is None:
        raise ToolInDoubt(f"{what} answered {status} without a usable access token; {later}")
    log.info("teams.token_fetched", expires_in_s=lifetime)
    return _Token(token, sent + lifetime - min(REFRESH_BEFORE_S, lifetime / 10))


def _granted(response: httpx.Response) -> tuple[str | None, float]:
    """The access token and its lifetime in seconds from a token answer (None if unusable)."""
    try:
        body: Any = response.json()
    except ValueError:
        return None, 0.0
    if not isinstance(body, dict):
        return None, 0.0
    token, expires_in = body.get("access_token"), body.get("expires_in")
    if isinstance(expires_in, bool) or not isinstance(expires_in, int | float | str):
        return None, 0.0
    try:
        lifetime = float(expires_in)  # some endpoints send it as a string
    except ValueError:
        return None, 0.0
    if not isinstance(token, str) or not token or not (lifetime > 0 and math.isfinite(lifetime)):
        return None, 0.0
    return token, lifetime


def _oauth_error(response: httpx.Response) -> str:
    try:
        body: Any = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and body.get("error"):
        return f"{body.get('error')}: {str(body.get('error_description') or '')[:200]}"
    return response.text[:200]


class BotConnector:
    """Requests to one of the bot's services for one call: the call's identity headers and
    timeout (`CallHTTP`) plus the bot's bearer token for that service (the Bot Connector by
    default), fetched again once when the service refuses it."""

    def __init__(
        self,
        settings: Settings,
        call: CallHTTP,
        source: TokenSource | None = None,
        service: str = "the Bot Connector",
    ) -> None:
        self.settings = settings
        self.call = call
        self.source = source or connector_tokens(settings)
        self.service = service
        # The token request names the run and attempt (for the records) but has no key.
        self._token_headers = {
            k: v for k, v in call.headers.items() if k.lower() != "idempotency-key"
        } | {"X-Liyagent-Call": "teams-token"}

    def _token(self, refused: str | None = None) -> str:
        return bot_token(
            self.settings,
            self._token_headers,
            self.call.timeout_s,
            refused=refused,
            source=self.source,
        )

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One request with the bot's token; on 401, once more with a new token."""
        token = self._token()
        response = self.call.request(method, url, headers=_bearer(token), **kwargs)
        if response.status_code != 401:
            return response
        log.info("teams.token_refused", method=method, next="fetching a new token, once")
        token = self._token(refused=token)
        response = self.call.request(method, url, headers=_bearer(token), **kwargs)
        if response.status_code == 401:
            raise ToolError(
                f"{method} {url}: {self.service} refused the bot's token twice (401), a new "
                f"one included; check {self.source.settings_named}",
                401,
            )
        return response

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
