"""PROJECTOR_REDIS_URL: one server or a Redis Cluster, checked before anything connects."""

from __future__ import annotations

import pytest
import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from app.redis_url import parse_redis_url
from app.settings import Settings, SettingsError
from app.stores.redis_client import DEFAULT_SOCKET_TIMEOUT_S, open_redis
from app.stores.redis_projection import RedisProjectionStore


@pytest.mark.parametrize(
    ("url", "cluster", "nodes", "db"),
    [
        ("redis://127.0.0.1:6379/0", False, (("127.0.0.1", 6379),), 0),
        ("redis://cache.example", False, (("cache.example", 6379),), 0),
        ("rediss://u:p@[::1]:6380/3", False, (("::1", 6380),), 3),
        ("redis://h:1?db=2&socket_timeout=2.5", False, (("h", 1),), 2),
        ("redis+cluster://127.0.0.1:7101", True, (("127.0.0.1", 7101),), 0),
        ("redis+cluster://a:1,b:2,c:3/0", True, (("a", 1), ("b", 2), ("c", 3)), 0),
        ("rediss+cluster://user:s%40cret@a:1?ssl_cert_reqs=none", True, (("a", 1),), 0),
    ],
)
def test_accepted_forms(url: str, cluster: bool, nodes: tuple[tuple[str, int], ...], db: int) -> None:
    target = parse_redis_url(url)
    assert (target.cluster, target.nodes, target.db) == (cluster, nodes, db)
    assert Settings.build(redis_url=url).redis.redis_url == url


def test_credentials_are_decoded_and_never_shown() -> None:
    target = parse_redis_url("rediss+cluster://user:s%40cret%2C@a:1,b:2")
    assert (target.username, target.password, target.tls) == ("user", "s@cret,", True)
    assert "cret" not in repr(target) and "cret" not in target.describe()
    assert target.describe() == "rediss+cluster://user:***@a:1,b:2"
    assert parse_redis_url("unix:///run/redis.sock?db=1").unix_path == "/run/redis.sock"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://h:6379?cluster=true", "redis+cluster://"),  # issue 15: was accepted and ignored
        ("redis://h:6379/0?cluster=yes&socket_timeout=1", "redis+cluster://"),
        ("redis://a:1,b:2", "redis+cluster://"),
        ("redis+cluster://h", "not HOST:PORT"),
        ("redis+cluster://a:1,,b:2", "not HOST:PORT"),
        ("redis+cluster://a:1/2", "database 0 only"),
        ("redis+cluster://a:1?db=1", "database 0 only"),
        ("redis://h?foo=1", "unknown option 'foo'"),
        ("redis://h?socket_timeout=fast", "socket_timeout"),
        ("redis://h?socket_timeout=nan", "socket_timeout"),
        ("redis://h?ssl_ca_certs=/x", "needs TLS"),
        ("redis://h/zero", "database number"),
        ("redis://h/1?db=1", "twice"),
        ("redis://h:0", "not a TCP port"),
        ("redis://:pw@h:70000", "not a TCP port"),
        ("http://h", "must start with"),
        ("redis+sentinel://h:1", "must start with"),
        ("unix://relative.sock", "absolute"),
        ("redis://h#frag", "fragment"),
    ],
)
def test_refused_forms_say_why(url: str, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_redis_url(url)
    assert says in str(caught.value)
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"PROJECTOR_REDIS_URL": url})
    assert "PROJECTOR_REDIS_URL: " in str(refused.value) and says in str(refused.value)


def test_a_refusal_never_echoes_the_password() -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"PROJECTOR_REDIS_URL": "redis://:hunter2@h:6379?cluster=true"})
    assert "hunter2" not in str(refused.value)


def test_retry_budget_is_a_checked_setting() -> None:
    assert Settings().redis.redis_retry_budget_ms == 30_000
    assert Settings.from_env({"PROJECTOR_REDIS_RETRY_BUDGET_MS": "0"}).redis.redis_retry_budget_ms == 0
    with pytest.raises(SettingsError, match="PROJECTOR_REDIS_RETRY_BUDGET_MS"):
        Settings.from_env({"PROJECTOR_REDIS_RETRY_BUDGET_MS": "-1"})


async def test_the_client_is_redis_pys_cluster_client_for_a_cluster_url() -> None:
    # Constructors do no I/O: no server needed.
    cluster = open_redis("redis+cluster://127.0.0.1:7101,127.0.0.1:7102?socket_timeout=3")
    plain = open_redis("redis://127.0.0.1:6379/2")
    try:
        assert isinstance(cluster, RedisCluster)
        assert sorted(n.port for n in cluster.nodes_manager.startup_nodes.values()) == [7101, 7102]
        assert isinstance(plain, redis.Redis)
        kwargs = plain.connection_pool.connection_kwargs
        assert (kwargs["db"], kwargs["socket_timeout"]) == (2, DEFAULT_SOCKET_TIMEOUT_S)
    finally:
        await cluster.aclose()
        await plain.aclose()
    settings = Settings.build(redis_url="redis+cluster://127.0.0.1:7101", redis_retry_budget_ms=1500)
    store = RedisProjectionStore.from_settings(settings.redis)
    try:
        assert isinstance(store.client, RedisCluster) and store.retry_budget_s == 1.5
        assert RedisProjectionStore.from_settings(settings.redis, retry_budget_s=0).retry_budget_s == 0
    finally:
        await store.aclose()


@pytest.mark.parametrize("namespace", ["proj", "rebuild-2024.01_x", "a", "n" * 64])
@pytest.mark.parametrize("user_id", [0, 7, 42, 123456789, (1 << 64) - 1])
def test_every_key_of_a_user_is_in_one_slot_whatever_the_namespace(namespace: str, user_id: int) -> None:
    # The cluster-safety of the write script and the MULTI reads rests on this (module docstring
    # of app/stores/redis_projection.py): one hash tag per user, none in the namespace.
    store = RedisProjectionStore(redis.Redis(), namespace)
    keys = [store.rows_key(user_id), store.meta_key(user_id), store.writes_key(user_id)]
    assert {key_slot(k.encode()) for k in keys} == {key_slot(str(user_id).encode())}
    for brace in ("{", "}"):
        with pytest.raises(ValueError, match="namespace"):
            RedisProjectionStore(redis.Redis(), f"ns{brace}")
