"""Sealing: AES-GCM with the run id, purpose and step bound in as associated data (I6). A
chained blob (a run's step records) also binds the digest of the record before it, so a record
removed, reordered, moved between runs or replaced by an older one does not verify.

A blob is `b"LS1" | len(kid) | kid | nonce(12) | ciphertext+tag`. The key id lets keys rotate:
the first key seals, every listed key still opens what it sealed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runtime.base.settings import ConfigError
from store.errors import LiyagentError

if TYPE_CHECKING:
    import redis

log = structlog.get_logger(__name__)

MAGIC = b"LS1"
ENV_KEYS = "LIYAGENT_SEAL_KEYS"
ENV_DEV_FILE = "LIYAGENT_DEV_SEAL_FILE"


class SealError(LiyagentError):
    """A blob does not verify: tampered, moved to another run or step, or its key is gone."""

    def __init__(self, run_id: str, what: str, why: str) -> None:
        super().__init__(
            f"run {run_id}: the sealed {what} does not verify ({why}); it is never used - the "
            "run is failed; check LIYAGENT_SEAL_KEYS still lists the key that sealed it"
        )
        self.run_id = run_id


class NoSealKeys(ConfigError):
    """This process was opened read-only and no seal key exists: nothing sealed can be opened
    (or sealed) here. Not a seal failure: nothing was found not to verify."""


def _aad(run_id: str, purpose: str, step: int, chain: bytes | None) -> bytes:
    if chain is None:
        return f"liyagent|{run_id}|{purpose}|{step}".encode()
    return f"liyagent|{run_id}|{purpose}|{step}|{chain.hex()}".encode()


def digest(blob: bytes) -> bytes:
    """What the next record of a chain binds: the SHA-256 of this sealed blob."""
    return hashlib.sha256(blob).digest()


@dataclass(frozen=True)
class Sealer:
    """Seals and opens JSON payloads with keyed authenticated encryption."""

    current: str
    keys: dict[str, bytes]
    # Why there are no keys (a read-only opening found none); empty when keys exist.
    missing: str = ""
    # The development key file these keys came from; empty for LIYAGENT_SEAL_KEYS.
    dev_file: str = ""

    def seal(
        self, run_id: str, purpose: str, step: int, payload: Any, chain: bytes | None = None
    ) -> bytes:
        """Seal `payload` for (run, purpose, step), and for `chain` (the digest of the record
        before it) when given."""
        self._require_keys()
        data = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
        nonce = secrets.token_bytes(12)
        kid = self.current.encode()
        body = AESGCM(self.keys[self.current]).encrypt(
            nonce, data, _aad(run_id, purpose, step, chain)
        )
        return MAGIC + bytes([len(kid)]) + kid + nonce + body

    def open(
        self, run_id: str, purpose: str, step: int, blob: bytes, chain: bytes | None = None
    ) -> Any:
        """The payload sealed for exactly (run, purpose, step, chain); SealError otherwise."""
        self._require_keys()
        if len(blob) < 5 or blob[:3] != MAGIC:
            raise SealError(run_id, purpose, "not a sealed blob")
        n = blob[3]
        kid = blob[4 : 4 + n].decode(errors="replace")
        key = self.keys.get(kid)
        if key is None:
            raise SealError(run_id, purpose, f"key id {kid!r} is not configured")
        nonce, body = blob[4 + n : 16 + n], blob[16 + n :]
        try:
            data = AESGCM(key).decrypt(nonce, body, _aad(run_id, purpose, step, chain))
        except InvalidTag:
            raise SealError(run_id, purpose, "authentication failed") from None
        return json.loads(data)

    def _require_keys(self) -> None:
        if not self.keys:
            raise NoSealKeys(self.missing or f"no seal keys: set {ENV_KEYS}")


def key_id(blob: bytes) -> str | None:
    """The id of the key that sealed `blob` (None when it is not a sealed blob)."""
    if len(blob) < 5 or blob[:3] != MAGIC:
        return None
    return blob[4 : 4 + blob[3]].decode(errors="replace")


def parse_keys(spec: str) -> Sealer:
    """`kid:base64key,kid2:base64key`: the first seals, all open. Keys are 32 bytes."""
    keys: dict[str, bytes] = {}
    order: list[str] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        kid, sep, b64 = item.partition(":")
        if not sep or not kid or len(kid) > 64:
            raise ConfigError(f"{ENV_KEYS}: each entry is kid:base64key, got {item[:20]!r}...")
        try:
            key = base64.b64decode(b64, validate=True)
        except binascii.Error:
            raise ConfigError(f"{ENV_KEYS}: key {kid!r} is not valid base64") from None
        if len(key) != 32:
            raise ConfigError(f"{ENV_KEYS}: key {kid!r} must be 32 bytes, got {len(key)}")
        keys[kid] = key
        order.append(kid)
    if not order:
        raise ConfigError(f"{ENV_KEYS} lists no key")
    return Sealer(current=order[0], keys=keys)


def new_key_entry(kid: str) -> str:
    """A fresh `kid:base64key` entry, for rotation: put it first in LIYAGENT_SEAL_KEYS."""
    return f"{kid}:{base64.b64encode(secrets.token_bytes(32)).decode()}"


# Development key files this process has already warned about (or left to another process).
_warned: set[str] = set()
# How long one deployment start stays quiet after its first process said the warning.
DEV_KEY_QUIET_S = 900


def _dev_file() -> Path:
    return Path(os.environ.get(ENV_DEV_FILE) or Path.home() / ".liyagent" / "dev-seal-keys")


def _configured(production: bool) -> Sealer | None:
    """The keys LIYAGENT_SEAL_KEYS lists; None when it is unset outside production."""
    spec = os.environ.get(ENV_KEYS, "").strip()
    if spec:
        return parse_keys(spec)
    if production:
        raise ConfigError(
            f"{ENV_KEYS} is not set and LIYAGENT_ENV=production: refusing to start without "
            "seal keys (make one with `liyagent keys new`)"
        )
    return None


def open_sealer(production: bool) -> Sealer:
    """For reads (`liyagent status`, `inspect`): the keys that exist, never creating one. With
    none (no LIYAGENT_SEAL_KEYS, no development key file) every open raises NoSealKeys, which
    says so; nothing is written."""
    configured = _configured(production)
    if configured is not None:
        return configured
    path = _dev_file()
    if path.exists():
        return parse_keys(path.read_text().strip())
    return Sealer(
        current="",
        keys={},
        missing=(
            f"no seal keys here: {ENV_KEYS} is not set and there is no development key file at "
            f"{path}, so sealed answers and checkpoints cannot be opened (a read never makes a "
            f"key); set {ENV_KEYS} to the deployment's keys"
        ),
    )


def load_sealer(production: bool) -> Sealer:
    """Keys from LIYAGENT_SEAL_KEYS; outside production a local dev key is made (for processes
    that seal: workers, the front, commands that start runs; reads use `open_sealer`), and
    `say_dev_key_once` warns of it."""
    configured = _configured(production)
    if configured is not None:
        return configured
    path = _dev_file()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(new_key_entry("dev1") + "\n")
        tmp.chmod(0o600)
        try:
            os.link(tmp, path)  # atomic: of two processes creating it, one wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return replace(parse_keys(path.read_text().strip()), dev_file=str(path))


def say_dev_key_once(sealer: Sealer, client: redis.Redis[bytes], namespace: str) -> None:
    """Warn that a development key seals, once per deployment start rather than once per
    process: the first process of the deployment (its Redis namespace) to build its services
    in DEV_KEY_QUIET_S takes a marker (SET NX) naming the key's fingerprint and says it; the
    others, a worker's pool children, beat, the front and CLI commands, stay silent. A second
    machine's different development key is said too. Redis out of reach: said anyway."""
    import redis  # here: a reader of sealed rows (`liyagent inspect`) needs no Redis client

    if not sealer.dev_file or sealer.dev_file in _warned:
        return
    _warned.add(sealer.dev_file)
    fingerprint = hashlib.sha256(sealer.keys[sealer.current]).hexdigest()[:16]
    try:
        first = client.set(
            f"{namespace}seal:dev-key-said:{fingerprint}", os.getpid(), nx=True, ex=DEV_KEY_QUIET_S
        )
    except redis.RedisError:
        first = True
    if first:
        log.warning(
            "seal.dev_key_in_use",
            path=sealer.dev_file,
            fingerprint=fingerprint,
            advice=f"set {ENV_KEYS} before production; this key exists only on this machine",
            repeats=f"said once per deployment start (then quiet for {DEV_KEY_QUIET_S // 60} min)",
        )
