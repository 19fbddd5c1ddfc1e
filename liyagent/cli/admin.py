"""`liyagent keys new|token` and `liyagent db upgrade`: what an operator sets up before anything
runs (a seal key, a front token, the schema)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime

from liyagent.cli.common import OK, USAGE, CliError, name_list, postgres_error, safe_url

_KID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def cmd_keys_new(args: argparse.Namespace) -> int:
    """Print one fresh `kid:base64key` entry for LIYAGENT_SEAL_KEYS."""
    from runtime.base.sealing import new_key_entry

    kid = args.kid or f"k{datetime.now(UTC):%Y%m%d}"
    if not _KID.fullmatch(kid):
        raise CliError(f"key id {kid!r}: use 1-64 letters, digits, '.', '_' or '-'", USAGE)
    print(new_key_entry(kid))
    return OK


def cmd_keys_token(args: argparse.Namespace) -> int:
    """Print a fresh bearer token for the front (line 1, give it to its holder) and its entry
    for LIYAGENT_FRONT_TOKENS_FILE (line 2: the principal, the token's SHA-256, the rights)."""
    import json
    import secrets

    from runtime.base.extras import need

    auth = need("front", "front.auth")
    Right, token_digest = auth.Right, auth.token_digest

    name = args.principal.strip()
    if not name or len(name) > 200 or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise CliError("the principal must be one line of 1-200 characters", USAGE)
    rights = name_list(args.rights, "--rights", [r.value for r in Right])
    token = secrets.token_urlsafe(32)
    print(token)
    print(json.dumps({"principal": name, "sha256": token_digest(token), "rights": rights}))
    return OK


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Migrate the database to the latest schema (Alembic head)."""
    import sqlalchemy as sa

    from runtime.base.sealing import open_sealer
    from runtime.base.settings import database_url, get_settings
    from runtime.durable.definition import legacy_sealer
    from store import migrate
    from store.db import Pooler

    settings = get_settings()
    if not args.url and settings.database_pooler is not Pooler.NONE:
        # A migration runs on a session of its own: Alembic's connection prepares statements
        # server-side, which a pooled server session would keep for its next client to trip on.
        raise CliError(
            f"LIYAGENT_DATABASE_POOLER={settings.database_pooler.value}: LIYAGENT_DATABASE_URL "
            "goes through a pooler, and a migration needs a session of its own on the server: "
            "give the server's own address with --url",
            USAGE,
        )
    url = database_url(args.url, "--url") if args.url else settings.database_url
    sealer = open_sealer(settings.production)
    try:
        # Runs in flight during the upgrade have their definitions sealed with the keys.
        migrate.upgrade(url, seal_definition=legacy_sealer(sealer) if sealer.keys else None)
    except sa.exc.OperationalError as exc:
        raise postgres_error(exc, url) from None
    except RuntimeError as exc:  # a migration that cannot go on says what to do
        raise CliError(str(exc), USAGE) from None
    print(f"{safe_url(url)}: the schema is at the latest revision", file=sys.stderr)
    return OK


def _keys(p: argparse.ArgumentParser) -> None:
    keys = p.add_subparsers(dest="action", required=True)
    k = keys.add_parser("new", help="print a fresh kid:base64key entry")
    k.add_argument("kid", nargs="?", help="key id (default: k<today>, e.g. k20261130)")
    k.set_defaults(handler=cmd_keys_new)
    k = keys.add_parser(
        "token",
        help="print a new front bearer token and its LIYAGENT_FRONT_TOKENS_FILE entry",
        description=(
            "Line 1: a new bearer token (give it to its holder; it is not stored). Line 2: its "
            'entry for the "tokens" list of LIYAGENT_FRONT_TOKENS_FILE or LIYAGENT_FRONT_TOKENS: '
            "the principal, the token's SHA-256 and the rights."
        ),
    )
    k.add_argument("principal", help="who the token speaks for (recorded as who decides/stops)")
    k.add_argument(
        "--rights",
        default="start,decide,stop,read",
        help="comma list of start, decide, stop, erase, read, operate (default: all but erase, "
        "which deletes runs' content, and operate, which reads every caller's runs and tasks, "
        "only when named)",
    )
    k.set_defaults(handler=cmd_keys_token)


def _db(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", required=True)
    u = actions.add_parser("upgrade", help="migrate to the latest schema")
    u.add_argument("--url", help="database URL (default: LIYAGENT_DATABASE_URL)")
    u.set_defaults(handler=cmd_db_upgrade)


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"keys": _keys, "db": _db}
