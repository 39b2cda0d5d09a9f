"""Fixtures for the port contract suites: one suite, every implementation of the port.

The Redis parameters need the real server and are marked `integration` (so `make test-fast`
leaves them out); like every integration test they FAIL, never skip, when the server is down.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as redis
from redis.exceptions import RedisError

from app.settings import Settings
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.redis_projection import RedisProjectionStore

HINT = "the Redis contract tests need the real server: run `make services-up` (or `make test`)"

ProjectionStoreUnderTest = InMemoryProjectionStore | RedisProjectionStore
# make_store(count_writes=False) -> a fresh, empty store of the parametrized kind
MakeStore = Callable[..., ProjectionStoreUnderTest]
MakeRedisStore = Callable[..., RedisProjectionStore]


@pytest.fixture
async def redis_client(settings: Settings) -> AsyncIterator[redis.Redis]:
    client = redis.Redis.from_url(settings.redis_url)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        pytest.fail(f"Redis at {settings.redis_url} not reachable ({exc}); {HINT}", pytrace=False)
    yield client
    await client.aclose()


@pytest.fixture
async def make_redis_store(
    redis_client: redis.Redis, unique_name: Callable[..., str]
) -> AsyncIterator[MakeRedisStore]:
    """Each call gives a store on a fresh namespace of the real server; all deleted after."""
    made: list[RedisProjectionStore] = []

    def make(count_writes: bool = False, **options: int) -> RedisProjectionStore:
        store = RedisProjectionStore(redis_client, unique_name("proj"), count_writes, **options)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.delete_all()
        left = [key async for key in redis_client.scan_iter(match=f"{store.namespace}:*")]
        assert left == [], f"namespace {store.namespace} not cleaned up: {left[:5]}"


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("redis", id="redis", marks=pytest.mark.integration),
    ]
)
def make_store(request: pytest.FixtureRequest) -> MakeStore:
    """The contract suite's factory: parametrized over every ProjectionStore implementation."""
    if request.param == "redis":
        # Requested lazily so the memory runs never touch (or need) the server.
        make_redis: MakeRedisStore = request.getfixturevalue("make_redis_store")
        return make_redis
    return lambda count_writes=False: InMemoryProjectionStore(count_writes=count_writes)


@pytest.fixture
def store(make_store: MakeStore) -> ProjectionStoreUnderTest:
    return make_store()
