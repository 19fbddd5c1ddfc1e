"""Bearer-token auth: every endpoint but /healthz and /metrics needs `Authorization: Bearer
<token>`, and each token names a principal with rights. With no token configured the front
refuses every request, never opens.

Tokens come from `LIYAGENT_FRONT_TOKENS_FILE` (a JSON file, e.g. a mounted secret) and
`LIYAGENT_FRONT_TOKENS` (the same JSON inline), each entry a principal, the SHA-256 digest of
its token (never the token itself) and its rights:

    {"tokens": [{"principal": "alice", "sha256": "<64 hex digits>",
                 "rights": ["decide", "stop", "start"]}]}

`LIYAGENT_FRONT_TOKEN` keeps working as one more token, principal `front-token`, with every
right. A presented token is hashed and compared with every configured digest in constant time.

Rights: `start` (start runs: webhooks, ticket events, co-pilot turns, A2A tasks, Teams
messages), `decide` (decide approvals), `stop` (stop runs and agents, and lift stops), `erase`
(erase a run's or an owner's runs' content, front/erasure.py), `read` (follow a run's event
stream: `GET /runs/{id}/events`, A2A SubscribeToTask), `operate` (an operator: every read sees
every run and A2A task, not only the principal's own). One-shot reads (`GET /runs/{id}`, A2A
GetTask and ListTasks) need a valid token and no right.

Every read is scoped to its principal (`Principal.scope`, store/scope.py): a principal sees
the runs and A2A tasks its tokens started (a sub-agent run counts as its parent's), an
operator sees all of them, and runs started inside the deployment (the client API, cron,
Teams, jobs) only an operator sees. Anything else answers exactly as a run or task that does
not exist (404, TaskNotFound), so guessing ids learns nothing. Request keys (webhook event
ids, A2A message ids, ...) are scoped the same way: another principal's key makes another run.
Several tokens may name one principal with different rights, e.g. a service's token with
`start` and its browser's with `read` alone, which follows the streams of that service's runs.

A browser's EventSource cannot send an Authorization header, so the events route alone also
takes the token as `?access_token=` (`requires(..., query_token=True)`); the access log and
the refusals log the path only, never the query, so the token reaches no log. Give a browser
a token that carries `read` and nothing else, naming the principal whose runs it follows. Who
decided or stopped is always the token's principal, never a name in the body (see `actor`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from front.errors import FrontError
from runtime.base.settings import ConfigError, Settings
from runtime.services import Services
from store.rows import RunNotFound
from store.scope import Scope, run_in_scope

Endpoint = Callable[[Request], Awaitable[Response]]
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="liyagent"'}
# The principal LIYAGENT_FRONT_TOKEN acts as (it has every right).
SHARED_PRINCIPAL = "front-token"
_DIGEST = re.compile(r"[0-9a-f]{64}")
_PRINCIPAL = re.compile(r"[^\x00-\x1f\x7f]{1,200}")


class Right(StrEnum):
    START = "start"  # start runs (every entry endpoint)
    DECIDE = "decide"  # decide approvals
    STOP = "stop"  # stop runs and agents, and lift stops
    ERASE = "erase"  # erase runs' content (a run, or an owner's runs)
    READ = "read"  # follow runs' event streams (SSE, A2A SubscribeToTask)
    OPERATE = "operate"  # read every run and A2A task, not only those it started (an operator)


WHAT = {
    Right.START: "start runs",
    Right.DECIDE: "decide approvals",
    Right.STOP: "stop runs and agents and lift stops",
    Right.ERASE: "erase runs",
    Right.READ: "follow runs' events",
    Right.OPERATE: "read every caller's runs and tasks",
}


@dataclass(frozen=True)
class Principal:
    """Who a bearer token speaks for, and what it may do."""

    name: str
    rights: frozenset[Right]

    def scope(self) -> Scope:
        """What its reads see: the runs and tasks it started, or all of them with `operate`."""
        return Scope(self.name, every=Right.OPERATE in self.rights)


@dataclass(frozen=True)
class Tokens:
    """The configured tokens, by the SHA-256 digest of each."""

    entries: tuple[tuple[bytes, Principal], ...]

    def find(self, presented: str) -> Principal | None:
        """The principal of `presented`, comparing its digest with every configured one in
        constant time (no early exit, so timing says nothing about which entry matched)."""
        digest = hashlib.sha256(presented.encode("utf-8")).digest()
        found: Principal | None = None
        for known, principal in self.entries:
            if hmac.compare_digest(digest, known):
                found = principal
        return found


def token_digest(token: str) -> str:
    """The SHA-256 hex digest of a token, as the tokens file stores it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _entry(raw: Any, where: str) -> tuple[bytes, Principal]:
    if not isinstance(raw, dict) or set(raw) - {"principal", "sha256", "rights"}:
        raise ConfigError(f'{where}: each token is {{"principal", "sha256", "rights"}}')
    name, digest, rights = raw.get("principal"), raw.get("sha256"), raw.get("rights")
    if not isinstance(name, str) or not _PRINCIPAL.fullmatch(name) or not name.strip():
        raise ConfigError(f"{where}: principal must be one line of 1-200 characters")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ConfigError(
            f"{where}: principal {name!r} needs sha256, the token's SHA-256 as 64 lowercase hex "
            "digits (`liyagent keys token` makes a token and its entry)"
        )
    known = {r.value for r in Right}
    if not isinstance(rights, list) or not all(isinstance(r, str) for r in rights):
        raise ConfigError(f"{where}: principal {name!r} needs rights, a list of {sorted(known)}")
    unknown = sorted(set(rights) - known)
    if unknown:
        raise ConfigError(f"{where}: principal {name!r}: unknown rights {unknown}")
    return bytes.fromhex(digest), Principal(name, frozenset(Right(r) for r in rights))


def _parse(text: str, where: str) -> list[tuple[bytes, Principal]]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where} is not JSON ({exc})") from None
    items = raw.get("tokens") if isinstance(raw, dict) else raw
    if not isinstance(items, list):
        raise ConfigError(f'{where}: use {{"tokens": [...]}} or a JSON list of tokens')
    return [_entry(item, f"{where} token {i + 1}") for i, item in enumerate(items)]


def load_tokens(settings: Settings) -> Tokens:
    """Every configured token (file, inline, the shared one); a malformed configuration is a
    ConfigError naming the variable, so the front refuses to start rather than guess."""
    entries: list[tuple[bytes, Principal]] = []
    if settings.front_tokens_file:
        try:
            text = Path(settings.front_tokens_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"LIYAGENT_FRONT_TOKENS_FILE={settings.front_tokens_file}: cannot read it "
                f"({exc.strerror or exc})"
            ) from None
        entries += _parse(text, "LIYAGENT_FRONT_TOKENS_FILE")
    if settings.front_tokens.strip():
        entries += _parse(settings.front_tokens, "LIYAGENT_FRONT_TOKENS")
    if settings.front_token:
        shared = Principal(SHARED_PRINCIPAL, frozenset(Right))
        entries.append((hashlib.sha256(settings.front_token.encode("utf-8")).digest(), shared))
    digests = [d for d, _ in entries]
    if len(set(digests)) != len(digests):
        raise ConfigError("the front's tokens: one token is configured twice; keep one entry")
    return Tokens(tuple(entries))


def services(request: Request) -> Services:
    """The services this app was created with."""
    found: Services = request.app.state.services
    return found


def _tokens(request: Request) -> Tokens:
    """The app's token table, read from its settings once."""
    state = request.app.state
    tokens: Tokens | None = getattr(state, "tokens", None)
    if tokens is None:
        try:
            tokens = state.tokens = load_tokens(services(request).settings)
        except ConfigError as exc:
            raise FrontError(503, f"the front's token configuration is invalid ({exc})") from None
    return tokens


def authenticate(request: Request, query_token: bool = False) -> Principal:
    """The principal of the request's bearer token: 503 when no token is configured, 401 for
    a missing or unknown one. `query_token`: with no Authorization header, the token may come
    as `?access_token=` (the events route only, for a browser's EventSource)."""
    tokens = _tokens(request)
    if not tokens.entries:
        raise FrontError(
            503,
            "the front has no token configured, so it refuses every request; set "
            "LIYAGENT_FRONT_TOKEN (or LIYAGENT_FRONT_TOKENS / LIYAGENT_FRONT_TOKENS_FILE) and "
            "restart it",
        )
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if not scheme and query_token:
        scheme, given = "bearer", request.query_params.get("access_token", "")
    principal = tokens.find(given.strip()) if scheme.lower() == "bearer" and given else None
    if principal is None:
        raise FrontError(
            401,
            "missing or wrong bearer token; send Authorization: Bearer <token> with a token "
            "configured in LIYAGENT_FRONT_TOKEN, LIYAGENT_FRONT_TOKENS or "
            "LIYAGENT_FRONT_TOKENS_FILE",
            headers=CHALLENGE,
        )
    return principal


def principal(request: Request) -> Principal:
    """The principal `protected`/`requires` authenticated for this request."""
    found: Principal = request.state.principal
    return found


def _check_seen(s: Services, run_id: str, scope: Scope) -> None:
    with s.engine.connect() as conn:
        if not run_in_scope(conn, run_id, scope):
            raise RunNotFound(run_id)


async def seen_run(request: Request, run_id: str) -> None:
    """RunNotFound (404) unless the run exists and the request's principal may see it: a run
    out of its scope answers exactly as one that does not exist."""
    await run_in_threadpool(_check_seen, services(request), run_id, principal(request).scope())


def actor(request: Request, body: dict[str, Any]) -> str:
    """Who acts (decides, stops, lifts): the token's principal. A body naming someone (`by`)
    is refused, so nobody can record another name, and nobody is misled into thinking the
    name they sent was recorded."""
    if "by" in body:
        raise FrontError(
            400,
            f'field "by" is not accepted: who acts is the principal of your bearer token '
            f"({principal(request).name}); remove it",
        )
    return principal(request).name


def lacks_right(name: str, right: Right) -> FrontError:
    """The 403 for a principal whose token does not carry the right an endpoint needs."""
    return FrontError(
        403,
        f"principal {name} lacks the right {right.value!r} (to {WHAT[right]}); "
        "use a token that has it",
        right=right.value,
    )


def _guard(endpoint: Endpoint, right: Right | None, query_token: bool = False) -> Endpoint:
    async def guarded(request: Request) -> Response:
        found = authenticate(request, query_token)
        if right is not None and right not in found.rights:
            raise lacks_right(found.name, right)
        request.state.principal = found
        return await endpoint(request)

    guarded.__name__ = endpoint.__name__
    guarded.__doc__ = endpoint.__doc__
    return guarded


def protected(endpoint: Endpoint) -> Endpoint:
    """The endpoint, run only for a request carrying a configured bearer token (any right)."""
    return _guard(endpoint, None)


def requires(right: Right, query_token: bool = False) -> Callable[[Endpoint], Endpoint]:
    """The endpoint, run only for a principal holding `right` (403 naming it otherwise);
    `query_token`: the token may also come as `?access_token=` (see the module's docstring)."""

    def decorate(endpoint: Endpoint) -> Endpoint:
        return _guard(endpoint, right, query_token)

    return decorate
