"""A sealed checkpoint opens only for its run, purpose and step, under a configured key (I6)."""

from __future__ import annotations

import pytest

from runtime.base.sealing import SealError, new_key_entry, parse_keys
from runtime.base.settings import ConfigError

PAYLOAD = {"step": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def sealer():
    return parse_keys(new_key_entry("k1"))


def test_round_trip(sealer) -> None:
    blob = sealer.seal("run-a", "checkpoint", 2, PAYLOAD)
    assert sealer.open("run-a", "checkpoint", 2, blob) == PAYLOAD
    assert b"messages" not in blob  # encrypted, not merely signed


@pytest.mark.parametrize("where", [0, 5, 20, -1, -17])
def test_flipped_byte_fails(sealer, where: int) -> None:
    blob = bytearray(sealer.seal("run-a", "checkpoint", 2, PAYLOAD))
    blob[where] ^= 0x01
    with pytest.raises(SealError, match="run-a"):
        sealer.open("run-a", "checkpoint", 2, bytes(blob))


def test_other_run_fails(sealer) -> None:
    blob = sealer.seal("run-a", "checkpoint", 2, PAYLOAD)
    with pytest.raises(SealError):
        sealer.open("run-b", "checkpoint", 2, blob)


def test_other_step_fails(sealer) -> None:
    blob = sealer.seal("run-a", "checkpoint", 2, PAYLOAD)
    with pytest.raises(SealError):
        sealer.open("run-a", "checkpoint", 3, blob)


def test_other_purpose_fails(sealer) -> None:
    blob = sealer.seal("run-a", "checkpoint", 0, PAYLOAD)
    with pytest.raises(SealError):
        sealer.open("run-a", "answer", 0, blob)


def test_rotated_key_still_opens_old_blobs() -> None:
    old = new_key_entry("k1")
    before = parse_keys(old)
    blob = before.seal("run-a", "checkpoint", 1, PAYLOAD)
    after = parse_keys(f"{new_key_entry('k2')},{old}")
    assert after.current == "k2"
    assert after.open("run-a", "checkpoint", 1, blob) == PAYLOAD
    fresh = after.seal("run-a", "checkpoint", 1, PAYLOAD)
    assert fresh[4:6] == b"k2"
    with pytest.raises(SealError, match="not configured"):
        before.open("run-a", "checkpoint", 1, fresh)


def test_retired_key_no_longer_opens() -> None:
    old = new_key_entry("k1")
    blob = parse_keys(old).seal("run-a", "checkpoint", 1, PAYLOAD)
    with pytest.raises(SealError, match="k1"):
        parse_keys(new_key_entry("k2")).open("run-a", "checkpoint", 1, blob)


@pytest.mark.parametrize("spec", ["", "nokey", "k1:not-base64!", "k1:YWJj"])
def test_bad_key_config_is_refused(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_keys(spec)


def test_production_refuses_to_start_without_keys(monkeypatch) -> None:
    from runtime.base.sealing import load_sealer

    monkeypatch.delenv("LIYAGENT_SEAL_KEYS", raising=False)
    with pytest.raises(ConfigError, match="production"):
        load_sealer(production=True)


def test_dev_default_generates_one_local_key(monkeypatch, tmp_path) -> None:
    from runtime.base.sealing import load_sealer

    monkeypatch.delenv("LIYAGENT_SEAL_KEYS", raising=False)
    monkeypatch.setenv("LIYAGENT_DEV_SEAL_FILE", str(tmp_path / "keys"))
    first = load_sealer(production=False)
    second = load_sealer(production=False)
    assert first == second
    assert (tmp_path / "keys").stat().st_mode & 0o777 == 0o600
