"""Real Redis: round trip and a Lua script through EVAL and EVALSHA (how flushes stay atomic)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from app.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# Write a hash of fields only if `version` is newer than the stored one: the shape of the
# projection store's versioned, all-or-nothing flush batch (docs/contract.md §3.9).
VERSIONED_WRITE = """
local current = tonumber(redis.call('HGET', KEYS[1], '_version') or '0')
local incoming = tonumber(ARGV[1])
if incoming <= current then
  return 0
end
redis.call('HSET', KEYS[1], '_version', ARGV[1], unpack(ARGV, 2))
return 1
"""


@pytest.fixture
async def redis_client(servers: Settings) -> AsyncIterator[object]:
    import redis.asyncio as redis

    client = redis.Redis.from_url(servers.redis.redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def key(unique_name: Callable[..., str]) -> str:
    return unique_name("proj", sep=":")


async def test_round_trip(redis_client: object, key: str) -> None:
    import redis.asyncio as redis

    assert isinstance(redis_client, redis.Redis)
    try:
        assert await redis_client.ping()
        await redis_client.set(key, b"\x00\xffbytes", ex=60)
        assert await redis_client.get(key) == b"\x00\xffbytes"
    finally:
        await redis_client.delete(key)


async def test_lua_script_via_eval_and_evalsha(redis_client: object, key: str) -> None:
    import redis.asyncio as redis
    from redis.exceptions import NoScriptError

    assert isinstance(redis_client, redis.Redis)
    try:
        # EVAL: the script text travels with the call.
        assert await redis_client.eval(VERSIONED_WRITE, 1, key, 5, "unread", 3) == 1
        # EVALSHA: load once, call by digest.
        sha = await redis_client.script_load(VERSIONED_WRITE)
        assert await redis_client.evalsha(sha, 1, key, 4, "unread", 99) == 0  # older: rejected
        assert await redis_client.evalsha(sha, 1, key, 6, "unread", 0, "mention", 1) == 1
        assert await redis_client.hgetall(key) == {
            b"_version": b"6",
            b"unread": b"0",
            b"mention": b"1",
        }
        # After a server restart (or SCRIPT FLUSH) the digest is unknown: the caller must fall
        # back to EVAL. redis-py's Script object does that by itself.
        await redis_client.script_flush()
        with pytest.raises(NoScriptError):
            await redis_client.evalsha(sha, 1, key, 7)
        script = redis_client.register_script(VERSIONED_WRITE)
        assert await script(keys=[key], args=[7, "unread", 2]) == 1
        assert await redis_client.hget(key, "unread") == b"2"
    finally:
        await redis_client.delete(key)
