"""One setting selects Sentinel for every Redis use: how `LIYAGENT_REDIS_URL` and
`LIYAGENT_REDIS_MASTER` are read, checked, and handed to the broker and the engine's clients."""

from __future__ import annotations

import pytest
from redis.sentinel import SentinelConnectionPool

from celeryconfig import config_for
from runtime.base.redis_clients import RedisTarget, client_for
from runtime.base.settings import ConfigError, Settings, redis_url, sentinel_url

URL = "sentinel://:pw@10.0.0.1:26380/2;sentinel://10.0.0.2;sentinel://sentinel-c:26381"


def test_a_sentinel_url_lists_every_sentinel_and_the_masters_db_and_password() -> None:
    parsed = sentinel_url(URL)
    assert parsed.hosts == (("10.0.0.1", 26380), ("10.0.0.2", 26379), ("sentinel-c", 26381))
    assert (parsed.db, parsed.username, parsed.password) == (2, None, "pw")
    assert redis_url(URL) == URL


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("sentinel://", "'sentinel://' is not a Sentinel"),
        ("sentinel://a:26379;redis://b:6379", "'redis://b:6379' is not a Sentinel"),
        ("sentinel://a:port", "'sentinel://a:port' is not a Sentinel"),
        ("sentinel://a/zero", "'sentinel://a/zero' is not a Sentinel"),
    ],
)
def test_a_malformed_sentinel_url_names_the_setting(raw: str, says: str) -> None:
    with pytest.raises(ConfigError, match="LIYAGENT_REDIS_URL") as caught:
        redis_url(raw)
    assert says in str(caught.value)


def test_the_master_name_is_required_with_sentinels_and_refused_without(monkeypatch) -> None:
    monkeypatch.setenv("LIYAGENT_REDIS_URL", URL)
    monkeypatch.delenv("LIYAGENT_REDIS_MASTER", raising=False)
    with pytest.raises(ConfigError, match="LIYAGENT_REDIS_MASTER is not set"):
        Settings.from_env()
    monkeypatch.setenv("LIYAGENT_REDIS_MASTER", "mymaster")
    settings = Settings.from_env()
    assert (settings.redis_url, settings.redis_master) == (URL, "mymaster")
    monkeypatch.setenv("LIYAGENT_REDIS_URL", "redis://127.0.0.1:6379/0")
    with pytest.raises(ConfigError, match="is not a sentinel:// URL"):
        Settings.from_env()


def test_the_broker_and_the_engine_take_the_master_from_the_one_setting() -> None:
    settings = Settings(redis_url=URL, redis_master="mymaster", namespace="ns:")
    conf = config_for(settings)
    assert conf["broker_url"] == URL
    assert conf["broker_transport_options"]["master_name"] == "mymaster"
    assert "master_name" not in config_for(Settings())["broker_transport_options"]
    # Building a client opens no connection: each one asks the Sentinels when it connects.
    client = client_for(RedisTarget.of(settings), client_name="lya:h-1", socket_timeout=1)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "mymaster"
    assert pool.connection_kwargs["client_name"] == "lya:h-1"  # the death watch's names
    assert (pool.connection_kwargs["db"], pool.connection_kwargs["password"]) == (2, "pw")
    client.close()


def test_a_sentinel_target_without_a_master_name_refuses_to_build_a_client() -> None:
    with pytest.raises(ConfigError, match="LIYAGENT_REDIS_MASTER is not set"):
        client_for(RedisTarget(URL))
