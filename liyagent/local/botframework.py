"""A stand-in for the Bot Framework channel that delivers Teams activities to a bot.

It holds an RSA key of its own, publishes its public half as a JWKS on loopback (the keys
endpoint the front is told about with `LIYAGENT_TEAMS_JWKS_URL`) with the channels the key is
endorsed for, signs each delivery's bearer JWT as the channel does (issuer, audience = the bot's
app id, a `serviceurl` claim, an expiry), and posts message activities to the bot's
`/api/messages`. It also makes up the bot's app password and registers the bot with the
simulators' token endpoint, so the workers can authenticate their replies to the connector
simulator and read them back through the simulators' Microsoft Graph (`worker_env`). Its
activities carry what Teams's message activities do, and no more: the tenant id, the sender as
Teams names them (a `TeamsUser`: `from.id`, the channel's own id of the user for this bot, and
`from.aadObjectId`, their Entra object id, neither of which changes when `from.name`, the
display name, does), and in a channel the team's and the channel's thread ids (never the team's
Microsoft 365 group id, which Teams sends only in `conversationUpdate` events; the workers ask
the Bot Connector's team details for it). What Teams knows besides is told to the simulators as
it happens in a tenant: the app installed in a team (`register_channel`), or in a person's
personal scope, with the chat it then has with them (`install_personal`, whose Graph id the
simulators make up and tell only through Graph). The demo, the kill trials and the tests deliver
their Teams turns with it; a real deployment points the front at Microsoft's keys endpoint and
the workers at Microsoft's token endpoints and Graph instead.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

ISSUER = "https://api.botframework.com"
# Where the simulators serve the token endpoints (Microsoft's paths under its login host).
TOKEN_PATH = "/botframework.com/oauth2/v2.0/token"
GRAPH_TOKEN_PATH = "/login.microsoftonline.com/{tenant}/oauth2/v2.0/token"
# The simulators' Graph shows a post at once (no lag unless a test sets one), so a resumed
# hand-on may trust an empty read after this long (Microsoft's Graph: the 5 s default).
SIM_GRAPH_SETTLE_MS = 1000


def new_key() -> rsa.RSAPrivateKey:
    """A fresh 2048-bit RSA signing key."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk_of(
    key: rsa.RSAPrivateKey, kid: str, endorsements: tuple[str, ...] = ("msteams",)
) -> dict[str, Any]:
    """The public half of `key` as a JWK, as the Bot Framework publishes its keys: with the
    channels it may sign for (`endorsements`)."""
    jwk: dict[str, Any] = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    return {**jwk, "kid": kid, "use": "sig", "alg": "RS256", "endorsements": list(endorsements)}


class _KeysHandler(BaseHTTPRequestHandler):
    server: _KeysServer

    def do_GET(self) -> None:
        body = json.dumps({"keys": self.server.keys}).encode()
        self.server.fetches += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: no line per key fetch."""


class _KeysServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, keys: list[dict[str, Any]]) -> None:
        self.keys = keys
        self.fetches = 0
        super().__init__(("127.0.0.1", 0), _KeysHandler)


@dataclass(frozen=True)
class TeamsUser:
    """A person of the bot's tenant: their Entra object id (which never changes) and the
    display name they have now (which they can change, and may share with others)."""

    name: str = "Ann Lee"
    aad_object_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def renamed(self, name: str) -> TeamsUser:
        """The same person under another display name."""
        return TeamsUser(name, self.aad_object_id)


@dataclass
class BotChannel:
    """The channel: its signing key and JWKS endpoint, tokens and activities for one bot."""

    app_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    issuer: str = ISSUER
    kid: str = field(default_factory=lambda: f"kid-{uuid.uuid4().hex[:8]}")
    key: rsa.RSAPrivateKey = field(default_factory=new_key, repr=False)
    # The channels the signing key is endorsed for in the JWKS.
    endorsements: tuple[str, ...] = ("msteams",)
    # The bot's app password (client secret) and the lifetime of the tokens it is issued.
    password: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    token_ttl_s: float = 3600.0
    # The Teams app that carries the bot: its manifest id (the catalog's `externalId`), not the
    # bot's app id, as a Teams Toolkit project has it.
    manifest_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    # The tenant the bot is installed in, and a team of it: its Microsoft 365 group id (Graph's
    # name for it) and the id activities name it with (its General channel's thread id).
    tenant_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    team_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    team_thread_id: str = field(
        default_factory=lambda: f"19:{uuid.uuid4().hex}@thread.tacv2", repr=False
    )
    # Who sends an activity that names no sender.
    user: TeamsUser = field(default_factory=TeamsUser)
    _server: _KeysServer | None = field(default=None, init=False, repr=False)

    def start(self) -> BotChannel:
        """Serve the JWKS on a free loopback port (in a daemon thread)."""
        self._server = _KeysServer([jwk_of(self.key, self.kid, self.endorsements)])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> BotChannel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def jwks_url(self) -> str:
        assert self._server is not None, "start the channel first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/keys"

    def env(self, agent: str) -> dict[str, str]:
        """The front's settings for this bot, answered by the catalog agent `agent`."""
        return {
            "LIYAGENT_TEAMS_APP_ID": self.app_id,
            "LIYAGENT_TEAMS_ISSUER": self.issuer,
            "LIYAGENT_TEAMS_JWKS_URL": self.jwks_url,
            "LIYAGENT_TEAMS_AGENT": agent,
        }

    def register(self, sim_url: str) -> None:
        """Make the bot known to the simulators' token endpoint (its password's hash only)."""
        digest = hashlib.sha256(self.password.encode()).hexdigest()
        body = {"app_id": self.app_id, "password_sha256": digest, "token_ttl_s": self.token_ttl_s}
        httpx.post(f"{sim_url}/sim/bots", json=body, timeout=10).raise_for_status()

    def worker_env(self, sim_url: str) -> dict[str, str]:
        """The workers' settings to reply as this bot through the connector simulator at
        `sim_url` (the bot is registered with its token endpoint first)."""
        self.register(sim_url)
        base = sim_url.rstrip("/")
        return {
            "LIYAGENT_TEAMS_APP_ID": self.app_id,
            "LIYAGENT_TEAMS_APP_PASSWORD": self.password,
            "LIYAGENT_TEAMS_MANIFEST_ID": self.manifest_id,
            "LIYAGENT_TEAMS_TOKEN_URL": f"{base}{TOKEN_PATH}",
            "LIYAGENT_TEAMS_GRAPH_URL": f"{base}/v1.0",
            "LIYAGENT_TEAMS_GRAPH_TOKEN_URL": f"{base}{GRAPH_TOKEN_PATH}",
            "LIYAGENT_TEAMS_GRAPH_SETTLE_MS": str(SIM_GRAPH_SETTLE_MS),
        }

    def register_channel(self, sim_url: str, channel_id: str) -> None:
        """Install the bot in its team (as the Bot Connector then knows it) and make a channel
        of the team known to the simulators' Graph."""
        team = {
            "team_id": self.team_thread_id,
            "aad_group_id": self.team_id,
            "name": "Support",
            "app_id": self.app_id,
        }
        httpx.post(f"{sim_url}/sim/teams", json=team, timeout=10).raise_for_status()
        body = {"team_id": self.team_id, "channel_id": channel_id}
        httpx.post(f"{sim_url}/sim/graph/channels", json=body, timeout=10).raise_for_status()

    def install_personal(
        self, sim_url: str, conversation: str, user: TeamsUser | None = None
    ) -> None:
        """The person (`user`, by default the channel's) adds the bot's app: Teams installs it
        in their personal scope and makes the one-on-one chat `conversation` is."""
        body = {
            "user_id": (user or self.user).aad_object_id,
            "app_id": self.app_id,
            "manifest_id": self.manifest_id,
            "conversation_id": conversation,
            "tenant_id": self.tenant_id,
        }
        httpx.post(f"{sim_url}/sim/teams/personal", json=body, timeout=10).raise_for_status()

    def token(
        self,
        service_url: str,
        *,
        audience: str | None = None,
        issuer: str | None = None,
        expires_in_s: float = 3600,
        key: rsa.RSAPrivateKey | None = None,
    ) -> str:
        """A channel token for one delivery (each argument can spoil it, for tests)."""
        now = int(time.time())
        claims = {
            "iss": issuer or self.issuer,
            "aud": audience or self.app_id,
            "serviceurl": service_url,
            "nbf": now - 5,
            "iat": now - 5,
            "exp": int(now + expires_in_s),
        }
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers={"kid": self.kid})

    def activity(
        self,
        *,
        conversation: str,
        text: str,
        service_url: str,
        activity_id: str | None = None,
        sender: TeamsUser | None = None,
        conversation_type: str = "personal",
    ) -> dict[str, Any]:
        """A Teams message activity from a person (`sender`, by default the channel's `user`)
        to this bot, in a `personal` chat, a `groupChat` (`19:...@thread.v2`) or a `channel`
        thread (`19:...;messageid=R`)."""
        data: dict[str, Any] = {"tenant": {"id": self.tenant_id}}
        if conversation_type == "channel":
            # As Teams sends a message in a channel: the team by its thread id only.
            channel = conversation.partition(";messageid=")[0]
            data["team"] = {"id": self.team_thread_id}
            data["channel"] = {"id": channel}
        return {
            "type": "message",
            "id": activity_id or str(int(time.time() * 1000)),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "channelId": "msteams",
            "serviceUrl": service_url,
            "from": self.account(sender or self.user),
            "conversation": {
                "id": conversation,
                "conversationType": conversation_type,
                "tenantId": self.tenant_id,
            },
            "recipient": {"id": f"28:{self.app_id}", "name": "liyagent"},
            "channelData": data,
            "text": text,
            "textFormat": "plain",
        }

    def account(self, user: TeamsUser) -> dict[str, str]:
        """`user` as a Teams activity's `from` names them: the id Teams gives the user for this
        bot (`29:` and an opaque string, the same for every message of theirs to it), their
        display name and their Entra object id."""
        pairwise = hashlib.sha256(f"{self.app_id}/{user.aad_object_id}".encode()).digest()
        opaque = base64.urlsafe_b64encode(pairwise).decode().rstrip("=")
        return {"id": f"29:1{opaque}", "name": user.name, "aadObjectId": user.aad_object_id}

    def post(
        self, http: httpx.Client, activity: dict[str, Any], token: str | None = None
    ) -> httpx.Response:
        """Deliver `activity` to the bot (`http` is aimed at the front), signed by default."""
        bearer = token if token is not None else self.token(str(activity["serviceUrl"]))
        # JSON as a channel's serializer writes it: non-ASCII escaped, so any text a test
        # sends (a lone surrogate included) reaches the front as the channel would send it.
        return http.post(
            "/api/messages",
            content=json.dumps(activity).encode(),
            headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"},
        )
