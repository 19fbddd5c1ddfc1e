"""Teams through the Bot Framework: `POST /api/messages` takes the channel's activities (the
HTTP side; everything else of Teams is the package `runtime/entries/teams/`).

Every request carries the channel's bearer JWT: its signature is checked against the keys the
keys endpoint (JWKS, `LIYAGENT_TEAMS_JWKS_URL`) publishes, with PyJWT; its issuer must be the
Bot Framework's (`LIYAGENT_TEAMS_ISSUER`), its audience the bot's app id
(`LIYAGENT_TEAMS_APP_ID`), it must not have expired (five minutes of clock skew allowed), and
its `serviceurl` claim must name the activity's serviceUrl (the Bot Connector the reply goes
to), and the activity's `channelId` must be among the signing key's `endorsements` in the JWKS
document (matched by the token's `kid`). Anything else is refused with 401 and nothing is
stored.

A message activity is stored in the durable inbox before the channel is answered 200, so a
delivery Teams repeats (at least once) is one row and one turn; its run is started at once, or
by beat's intake if starting fails. Other activity types (conversation updates, typing) are
acknowledged and not stored. A message's run is owned by its sender's Microsoft Entra object
id (`from.aadObjectId`), never their display name: one without it is refused with 400 and
nothing is stored (`runtime/entries/teams/inbox.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jwt
import structlog
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from front.auth import services
from front.body import read_json, text_problem
from front.errors import FrontError
from front.parts import FrontPart
from runtime.entries.start import catalog_agent
from runtime.entries.teams.inbox import TeamsTurn, receive_and_start, teams_owner
from runtime.entries.teams.settings import TeamsSettings, teams_settings
from runtime.services import Services

log = structlog.get_logger("front")

CHALLENGE = {"WWW-Authenticate": 'Bearer realm="botframework"'}
# Bot Framework tokens allow this much clock skew (its authentication spec says five minutes).
LEEWAY_S = 300
_MENTION = re.compile(r"<at>.*?</at>", re.IGNORECASE | re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Activity types Teams sends a bot besides messages; any other is logged as "other" (a value a
# client chose never reaches the log).
ACTIVITY_TYPES = frozenset(
    {
        "conversationUpdate",
        "installationUpdate",
        "typing",
        "messageReaction",
        "messageUpdate",
        "messageDelete",
        "invoke",
        "event",
        "endOfConversation",
    }
)


class ChannelKeys(jwt.PyJWKClient):
    """The client of the channel's keys endpoint: keys cached for an hour, fetched again when a
    token names a key it has not seen (at most every 30 s, so made-up key ids cannot make the
    front hammer the endpoint). It also keeps each key's `endorsements` (the channels the key
    may sign for), which PyJWT's key objects do not carry, from the same JWKS document."""

    def __init__(self, url: str) -> None:
        super().__init__(url, lifespan=3600, timeout=10)
        self._endorsements: dict[str, tuple[str, ...]] = {}

    def fetch_data(self) -> Any:
        """The JWKS document (PyJWT fetches and caches it), with its endorsements kept by kid."""
        data = super().fetch_data()
        keys = data.get("keys") if isinstance(data, dict) else None
        endorsements: dict[str, tuple[str, ...]] = {}
        for jwk in keys if isinstance(keys, list) else []:
            if isinstance(jwk, dict) and isinstance(jwk.get("kid"), str):
                listed = jwk.get("endorsements")
                names = listed if isinstance(listed, list) else []
                endorsements[jwk["kid"]] = tuple(n for n in names if isinstance(n, str))
        self._endorsements = endorsements
        return data

    def endorsements(self, kid: str | None) -> tuple[str, ...]:
        """The channels the key `kid` is endorsed for, as the last JWKS document listed them."""
        return self._endorsements.get(kid or "", ())


def keys_client(settings: TeamsSettings) -> ChannelKeys:
    """The front's client of the channel's keys endpoint (`LIYAGENT_TEAMS_JWKS_URL`)."""
    return ChannelKeys(settings.jwks_url)


def _refused(why: str) -> FrontError:
    return FrontError(401, f"the Bot Framework token was refused: {why}", headers=CHALLENGE)


@dataclass(frozen=True)
class Verified:
    """A channel token that checked out: its claims and the channels its key is endorsed for."""

    claims: dict[str, Any]
    endorsements: tuple[str, ...]


def verify(keys: ChannelKeys, settings: TeamsSettings, token: str) -> Verified:
    """The token's claims once its signature, issuer, audience and lifetime check out;
    FrontError 401 otherwise (503 when the keys endpoint cannot be reached)."""
    try:
        key = keys.get_signing_key_from_jwt(token)
        claims: dict[str, Any] = jwt.decode(
            token,
            key.key,
            algorithms=["RS256"],
            audience=settings.app_id,
            issuer=settings.issuer,
            leeway=LEEWAY_S,
            options={"require": ["exp", "iss", "aud"]},
        )
    except jwt.PyJWKClientConnectionError as exc:
        log.warning("front.teams_keys_unreachable", url=settings.jwks_url, error=str(exc))
        raise FrontError(
            503,
            f"the Bot Framework keys at {settings.jwks_url} cannot be fetched now; the "
            "channel retries the activity",
        ) from None
    except (jwt.PyJWTError, ValueError) as exc:
        raise _refused(str(exc) or type(exc).__name__) from None
    return Verified(claims, keys.endorsements(key.key_id))


def check_endorsed(verified: Verified, activity: dict[str, Any]) -> None:
    """401 unless the activity's channelId is among its signing key's endorsements (the Bot
    Framework's rule: a key signs only for the channels that endorse it)."""
    channel = activity.get("channelId")
    if not isinstance(channel, str) or not channel:
        raise _refused("the activity names no channelId for the signing key to endorse")
    if channel not in verified.endorsements:
        raise _refused(f"its signing key is not endorsed for channel {channel[:60]!r}")


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _refused("send Authorization: Bearer <the channel's JWT>")
    return token.strip()


def _line(value: Any, what: str, limit: int = 1000) -> str:
    if not isinstance(value, str) or not value.strip():
        raise FrontError(400, f"the activity's {what} is required (a non-empty string)")
    if len(value) > limit or _CONTROL.search(value):
        raise FrontError(400, f"the activity's {what} must be one line of at most {limit} chars")
    return value


def _account(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FrontError(400, f"the activity's {what} must be an object with an id")
    _line(value.get("id"), f"{what}.id")
    return value


def parse_activity(activity: dict[str, Any]) -> TeamsTurn:
    """A message activity as a turn: its id, conversation, serviceUrl, sender (their Entra
    object id, never their display name) and text (the bot's own @mention taken out); 400
    naming the first thing missing or wrong."""
    service_url = _line(activity.get("serviceUrl"), "serviceUrl", 2000)
    parts = urlsplit(service_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise FrontError(400, "the activity's serviceUrl must be an http(s) URL")
    sender_id = teams_owner(_account(activity.get("from"), "from"))
    conversation = _account(activity.get("conversation"), "conversation")
    raw = activity.get("text")
    text = _MENTION.sub("", raw).strip() if isinstance(raw, str) else ""
    if not text:
        raise FrontError(400, "the activity has no text to answer")
    problem = text_problem(text)
    if problem is not None:
        raise FrontError(400, f"the activity's text {problem}")
    return TeamsTurn(
        activity_id=_line(activity.get("id"), "id", 200),
        conversation=str(conversation["id"]),
        service_url=service_url,
        sender_id=sender_id,
        text=text,
        activity=activity,
    )


def _agent(s: Services) -> str:
    agent = teams_settings().agent
    try:
        catalog_agent(s.settings, s.tools, agent)
    except ValueError as exc:
        raise FrontError(
            503, f"LIYAGENT_TEAMS_AGENT={agent!r} cannot answer Teams ({exc}); fix the setting"
        ) from None
    return agent


def _receive(s: Services, turn: TeamsTurn) -> tuple[int, bool]:
    """Store the turn in the durable inbox and start its run (`runtime/entries/teams/inbox.py`)."""
    return receive_and_start(s, turn, _agent(s))


async def messages(request: Request) -> Response:
    """POST /api/messages: one Bot Framework activity, stored once before it is answered."""
    s = services(request)
    settings = teams_settings()
    if not settings.app_id:
        raise FrontError(
            503,
            "the front has no Teams bot configured, so it refuses every activity; set "
            "LIYAGENT_TEAMS_APP_ID (and LIYAGENT_TEAMS_JWKS_URL) and restart it",
        )
    token = _bearer(request)
    keys: ChannelKeys = request.app.state.teams_keys
    verified = await run_in_threadpool(verify, keys, settings, token)
    activity = await read_json(request)
    check_endorsed(verified, activity)
    kind = activity.get("type")
    if kind != "message":
        shown = kind if isinstance(kind, str) and kind in ACTIVITY_TYPES else "other"
        log.info("front.teams_activity_ignored", type=shown)
        return JSONResponse({}, status_code=200)
    turn = parse_activity(activity)
    if verified.claims.get("serviceurl") != turn.service_url:
        raise _refused("its serviceurl claim does not name the activity's serviceUrl")
    inbox_id, created = await run_in_threadpool(_receive, s, turn)
    log.info(
        "front.teams_activity",
        inbox_id=inbox_id,
        created=created,
        activity_id=turn.activity_id,
        conversation=turn.conversation,
    )
    return JSONResponse({"inbox_id": inbox_id, "created": created}, status_code=200)


def _setup(app: Starlette, s: Services) -> None:
    """The app's one client of the channel's keys, read by `messages`."""
    app.state.teams_keys = keys_client(teams_settings())


# The Bot Framework's endpoint (`liyagent.front_routes`, pyproject.toml; the `teams` extra).
PART = FrontPart("teams", [Route("/api/messages", messages, methods=["POST"])], _setup)
