"""The bot's side of its services (the Bot Connector, Microsoft Graph): its token, requests that
carry it, and reads tried again while the service is only briefly unable to answer.

A real tenant refuses a request that does not carry the bot's token. The token comes from the
OAuth 2.0 client-credentials flow: the bot's app id (`LIYAGENT_TEAMS_APP_ID`) and app password
(read when needed from `LIYAGENT_TEAMS_APP_PASSWORD_FILE`, or from the environment variable
`LIYAGENT_TEAMS_APP_PASSWORD_ENV` names, `LIYAGENT_TEAMS_APP_PASSWORD` by default) are posted
to the token endpoint for the service's scope: the connector's (`LIYAGENT_TEAMS_TOKEN_URL`,
`LIYAGENT_TEAMS_TOKEN_SCOPE`), or Graph's at the tenant's endpoint
(`LIYAGENT_TEAMS_GRAPH_TOKEN_URL`, `{tenant}` being the activity's tenant id,
`LIYAGENT_TEAMS_GRAPH_SCOPE`). A token is kept per process until shortly before it expires (a
tenth of its lifetime, at most five minutes, early), and the request for it goes through this
process's guarded client (`http.py`), so an attempt that lost its lease sends nothing.

Every request carries `Authorization: Bearer <token>`. A 401 means the service refused the
token and did nothing, so the token is fetched again once and the request sent once more: a
refused token is not a refused request. A second 401 is a definite refusal.

A token endpoint that cannot be reached, times out, or answers 5xx or 429 leaves the reply in
doubt (`ToolInDoubt`: the attempt ends as a crash does and a later attempt reads the reply back
and posts it); one that refuses the credentials (4xx) is a definite refusal (`ToolError`) that
names the settings to fix.

A read (`read_json`) changes nothing, so one that meets a 429, a 5xx or no answer is sent again
in place, a few times, honouring a short Retry-After; only then is the reply left in doubt. A
refusal (another 4xx) is never tried again: the caller says what to grant.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import structlog

from runtime.base import process
from runtime.entries.teams.settings import TeamsSettings
from runtime.sending import http
from runtime.sending.call_http import CallHTTP
from runtime.toolbox.tools import ToolError, ToolInDoubt

log = structlog.get_logger(__name__)

# What a refusal to read back says the operator can do instead.
OFF = "set LIYAGENT_TEAMS_READ_BACK=off on the workers to post without reading back (a crash "
OFF += "between the post and its delivery record can then post the reply twice)"

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


def connector_tokens(settings: TeamsSettings) -> TokenSource:
    """The Bot Connector's: Microsoft's `botframework.com` endpoint (or the setting's)."""
    url = settings.token_url
    return TokenSource(
        url,
        settings.token_scope,
        f"the Bot Framework token endpoint {url} (LIYAGENT_TEAMS_TOKEN_URL)",
        "LIYAGENT_TEAMS_APP_ID, the bot's app password and LIYAGENT_TEAMS_TOKEN_SCOPE",
    )


# (token URL, app id, scope) -> the token in use; a forked child asks for its own.
_tokens: process.Cache[tuple[str, str, str], _Token] = process.Cache(
    "runtime.entries.teams.connector", "_tokens"
)


def bot_token(
    settings: TeamsSettings,
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
    key = (source.url, settings.app_id, source.scope)
    with _tokens.lock:
        held = _tokens.items.get(key)
        if held is not None and held.value != refused and time.monotonic() < held.use_until:
            return held.value
        fresh = _fetch(settings, source, headers, timeout_s)
        _tokens.items[key] = fresh
        return fresh.value


def app_password(settings: TeamsSettings) -> str:
    """The bot's app password, read now; `ToolError` naming the setting when there is none."""
    path = settings.app_password_file
    if path:
        where = f"the file {path} (LIYAGENT_TEAMS_APP_PASSWORD_FILE)"
        try:
            value = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise ToolError(f"the bot's app password cannot be read from {where}: {exc}") from None
    else:
        where = f"the environment variable {settings.app_password_env}"
        value = os.environ.get(settings.app_password_env, "")
    if not value:
        raise ToolError(
            f"the Teams bot has no app password to authenticate its replies with; put it in "
            f"{where} on the workers (LIYAGENT_TEAMS_APP_PASSWORD_ENV or "
            "LIYAGENT_TEAMS_APP_PASSWORD_FILE choose where it is read from)"
        )
    return value


def _fetch(
    settings: TeamsSettings, source: TokenSource, headers: dict[str, str], timeout_s: float
) -> _Token:
    """A new token from the token endpoint (client credentials)."""
    if not settings.app_id:
        raise ToolError(
            "the workers have no Teams bot to authenticate replies as; set "
            "LIYAGENT_TEAMS_APP_ID (and the bot's app password) on them"
        )
    url = source.url
    form = {
        "grant_type": "client_credentials",
        "client_id": settings.app_id,
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
        settings: TeamsSettings,
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


def graph_tokens(settings: TeamsSettings, tenant: str) -> TokenSource:
    """The tenant's token endpoint for Microsoft Graph (app-only, client credentials)."""
    url = settings.graph_token_url.replace("{tenant}", q(tenant))
    return TokenSource(
        url,
        settings.graph_scope,
        f"the Microsoft Graph token endpoint {url} (LIYAGENT_TEAMS_GRAPH_TOKEN_URL)",
        "LIYAGENT_TEAMS_APP_ID, the bot's app password, LIYAGENT_TEAMS_GRAPH_TOKEN_URL and "
        "LIYAGENT_TEAMS_GRAPH_SCOPE (and that the app is consented in the tenant)",
    )


def graph(settings: TeamsSettings, call: CallHTTP, tenant: str) -> BotConnector:
    """Requests to Microsoft Graph in `tenant` as the bot (its app-only token)."""
    return BotConnector(settings, call, graph_tokens(settings, tenant), "Microsoft Graph")


def q(part: str) -> str:
    """`part` as one path segment."""
    return quote(part, safe="")


# ---- Reads, tried again while the service is briefly unable to answer ---------------------

# How many times a read is sent when it meets a 429, a 5xx or no answer.
READ_TRIES = 3
# The waits before the second and the third try, unless a Retry-After asks for longer; that is
# honoured up to RETRY_AFTER_MAX_S (a longer one is the later attempt's to wait out).
READ_BACKOFF_S = (0.5, 1.5)
RETRY_AFTER_MAX_S = 5.0
_TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class Refusal:
    """What a read asks ("to list chat X") and what the operator can do when it is refused
    ("grant the bot's app P"), besides turning read-back off: the refusal's error says both."""

    asked: str
    remedy: str


def read_json(
    service: BotConnector,
    url: str,
    params: dict[str, str] | None,
    refusal: Refusal,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """The JSON object a GET of `url` answers. A 429, a 5xx or no answer is tried again (at most
    READ_TRIES sends) and then leaves the reply in doubt (`ToolInDoubt`); any other 4xx is a
    definite refusal (`ToolError`) that says what was asked and what to do (`refusal`)."""
    what = f"GET {url}"
    for tried in range(1, READ_TRIES + 1):
        try:
            response = service.get(url, params=params)
        except _TRANSIENT as exc:
            why, wait = f"{type(exc).__name__}: {exc}", None
        except httpx.HTTPError as exc:
            raise ToolError(f"{what}: {exc}") from exc
        else:
            status = response.status_code
            if status < 400:
                return _object(what, service.service, response)
            if status != 429 and status < 500:
                raise ToolError(
                    f"{service.service} refused {refusal.asked} ({status} "
                    f"{service_error(response)}), so the reply cannot be read back before it "
                    f"is posted; {refusal.remedy}, or {OFF}",
                    status,
                )
            why, wait = f"{service.service} answered {status}", _retry_after(response)
        if tried == READ_TRIES:
            raise ToolInDoubt(f"{what}: {why}, {READ_TRIES} times; a later attempt reads back")
        wait = READ_BACKOFF_S[tried - 1] if wait is None else min(wait, RETRY_AFTER_MAX_S)
        log.info("teams.read_retried", service=service.service, tried=tried, wait_s=wait)
        http.check_send()  # waiting on is for an attempt that still holds its run
        sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


def _object(what: str, service: str, response: httpx.Response) -> dict[str, Any]:
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        status = response.status_code
        raise ToolInDoubt(f"{what}: {service} answered {status} without a JSON object")
    return body


def _retry_after(response: httpx.Response) -> float | None:
    """The answer's Retry-After in seconds, when it gives a number of them."""
    raw = response.headers.get("Retry-After", "")
    try:
        seconds = float(raw)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def service_error(response: httpx.Response) -> str:
    """What a service's error answer says (its `error.code` and `error.message`, as the Bot
    Connector and Graph put them), shortened."""
    try:
        body: Any = response.json()
    except ValueError:
        return response.text[:200]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return f"{error.get('code')}: {str(error.get('message') or '')[:200]}"
    return response.text[:200]
