"""Fixtures for the port contract suites: one suite, every implementation of the port.

The Redis parameters need the real servers and are marked `integration` (so `make test-fast`
leaves them out): the single server (6379) and the local Redis Cluster (7101-7106, through
redis-py's cluster client, as `PROJECTOR_REDIS_URL=redis+cluster://...` builds it). Like every
integration test they FAIL, never skip, when a server is down.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as redis
from redis.exceptions import RedisError

from app.settings import Settings
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.redis_client import RedisClient, open_redis
from app.stores.redis_projection import STORE_ERRORS, RedisProjectionStore
from tests.support import redis_cluster

HINT = "the Redis contract tests need the real server: run `make services-up` (or `make test`)"

ProjectionStoreUnderTest = InMemoryProjectionStore | RedisProjectionStore
# make_store(count_writes=False) -> a fresh, empty store of the parametrized kind
MakeStore = Callable[..., ProjectionStoreUnderTest]
MakeRedisStore = Callable[..., RedisProjectionStore]


@pytest.fixture
async def standalone_client(settings: Settings) -> AsyncIterator[redis.Redis]:
    client = redis.Redis.from_url(settings.redis.redis_url)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        pytest.fail(f"Redis at {settings.redis.redis_url} not reachable ({exc}); {HINT}", pytrace=False)
    yield client
    await client.aclose()


@pytest.fixture
async def cluster_client() -> AsyncIterator[RedisClient]:
    client = open_redis(redis_cluster.URL)
    try:
        await client.ping()
    except STORE_ERRORS as exc:
        await client.aclose()
        pytest.fail(f"Redis Cluster at {redis_cluster.URL} not reachable ({exc}); {redis_cluster.HINT}")
    yield client
    await client.aclose()


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("redis-cluster", marks=pytest.mark.integration),
    ]
)
def redis_client(request: pytest.FixtureRequest) -> RedisClient:
    """The Redis-only tests' client: the single server, then the cluster."""
    client: RedisClient = request.getfixturevalue(
        "standalone_client" if request.param == "redis" else "cluster_client"
    )
    return client


def _store_factory(
    client: RedisClient, unique_name: Callable[..., str]
) -> tuple[MakeRedisStore, Callable[[], Awaitable[None]]]:
    """Stores on fresh namespaces of `client`, and the clean-up that deletes them all."""
    made: list[RedisProjectionStore] = []

    def make(count_writes: bool = False, **options: int) -> RedisProjectionStore:
        store = RedisProjectionStore(client, unique_name("proj"), count_writes, **options)
        made.append(store)
        return store

    async def clean() -> None:
        for store in made:
            await store.delete_all()
            left = [key async for key in client.scan_iter(match=f"{store.namespace}:*")]
            assert left == [], f"namespace {store.namespace} not cleaned up: {left[:5]}"

    return make, clean


@pytest.fixture
async def make_redis_store(
    redis_client: RedisClient, unique_name: Callable[..., str]
) -> AsyncIterator[MakeRedisStore]:
    """Each call gives a store on a fresh namespace of `redis_client`; all deleted after."""
    make, clean = _store_factory(redis_client, unique_name)
    yield make
    await clean()


@pytest.fixture
async def make_standalone_store(
    standalone_client: redis.Redis, unique_name: Callable[..., str]
) -> AsyncIterator[MakeRedisStore]:
    make, clean = _store_factory(standalone_client, unique_name)
    yield make
    await clean()


@pytest.fixture
async def make_cluster_store(
    cluster_client: RedisClient, unique_name: Callable[..., str]
) -> AsyncIterator[MakeRedisStore]:
    make, clean = _store_factory(cluster_client, unique_name)
    yield make
    await clean()


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("redis", id="redis", marks=pytest.mark.integration),
        pytest.param("redis-cluster", id="redis-cluster", marks=pytest.mark.integration),
    ]
)
def make_store(request: pytest.FixtureRequest) -> MakeStore:
    """The contract suite's factory: parametrized over every ProjectionStore implementation."""
    if request.param != "memory":
        # Requested lazily so the memory runs never touch (or need) a server.
        name = "make_standalone_store" if request.param == "redis" else "make_cluster_store"
        make_redis: MakeRedisStore = request.getfixturevalue(name)
        return make_redis
    return lambda count_writes=False: InMemoryProjectionStore(count_writes=count_writes)


@pytest.fixture
def store(make_store: MakeStore) -> ProjectionStoreUnderTest:
    return make_store()
