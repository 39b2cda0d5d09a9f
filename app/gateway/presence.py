"""Presence: which users have a live stream on any gateway instance (Redis, with a TTL).

Layout (``ns`` = the base projection namespace; ``{42}`` is the Redis Cluster hash tag of the
user, as in the projection store)::

    {ns}:presence:{<user_id>}   sorted set   member = gateway instance id
                                             score  = when that instance's claim expires (ms)

An instance adds itself when a user's first stream opens there, refreshes the claims of all its
connected users every third of the TTL, and removes itself when the user's last stream there
ends (opens and ends are written in batches, a pipeline every 100 ms: 10,000 streams opening
at once cost a few round trips, not 10,000 concurrent ones). A user is online while any
claim's expiry is in the future, so several instances agree without talking to each other,
and a crashed instance's users count as offline once its claims run out (at most
``gateway_presence_ttl_ms``). The key itself expires a TTL after its last
refresh, so nothing is left behind. Instances' clocks are assumed NTP-close (skew eats into the
TTL).

Failures are counted and logged, never raised: presence only decides whether an offline push
goes out, and a stream must not break because Redis blinked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from redis.exceptions import RedisError

log = logging.getLogger("projector.gateway.presence")

_CHUNK: Final = 500  # users per pipelined round trip


def presence_key(namespace: str, user_id: int) -> str:
    return f"{namespace}:presence:{{{user_id}}}"


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class RedisPresence:
    def __init__(
        self,
        client: Any,  # redis.asyncio.Redis (or a cluster client): pipelines of single-key commands
        namespace: str,
        instance: str,
        ttl_ms: int,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.instance = instance
        self.ttl_ms = ttl_ms
        self.clock_ms = clock_ms
        self.failures = 0

    def key(self, user_id: int) -> str:
        return presence_key(self.namespace, user_id)

    async def claim(self, user_ids: Sequence[int]) -> bool:
        """This instance serves these users now (a first stream, or the periodic refresh)."""
        now = self.clock_ms()
        expires = now + self.ttl_ms
        for start in range(0, len(user_ids), _CHUNK):
            pipe = self.client.pipeline(transaction=False)
            for user_id in user_ids[start : start + _CHUNK]:
                key = self.key(user_id)
                pipe.zadd(key, {self.instance: expires})
                pipe.zremrangebyscore(key, "-inf", now)  # claims of instances that are gone
                pipe.pexpire(key, self.ttl_ms)
            if not await self._run(pipe, "claim"):
                return False
        return True

    async def release(self, user_ids: Sequence[int]) -> bool:
        """These users' last stream on this instance ended."""
        for start in range(0, len(user_ids), _CHUNK):
            pipe = self.client.pipeline(transaction=False)
            for user_id in user_ids[start : start + _CHUNK]:
                pipe.zrem(self.key(user_id), self.instance)
            if not await self._run(pipe, "release"):
                return False
        return True

    async def online(self, user_ids: Sequence[int]) -> set[int] | None:
        """The users of ``user_ids`` with a live stream on any instance; None when Redis failed
        (the caller decides: the push producer then treats nobody as online, see push.py)."""
        now = self.clock_ms()
        found: set[int] = set()
        for start in range(0, len(user_ids), _CHUNK):
            chunk = user_ids[start : start + _CHUNK]
            pipe = self.client.pipeline(transaction=False)
            for user_id in chunk:
                pipe.zcount(self.key(user_id), f"({now}", "+inf")
            try:
                counts = await pipe.execute()
            except (RedisError, OSError) as exc:
                self._failed("online", exc)
                return None
            found.update(u for u, n in zip(chunk, counts, strict=True) if int(n) > 0)
        return found

    async def _run(self, pipe: Any, what: str) -> bool:
        try:
            await pipe.execute()
        except (RedisError, OSError) as exc:
            self._failed(what, exc)
            return False
        return True

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        log.warning("presence %s failed (%d so far): %s", what, self.failures, exc)
