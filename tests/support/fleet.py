"""Several query API apps on one projection store, as a fleet of `projector api` processes is
(issue 32): each app has its own Redis client and store object, its own snapshot cache and
counters; they share only what is in Redis. Served by aiohttp's TestServer over TCP."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from app.api import Deps, create_app
from app.api.sources import RedisProjectionReader
from app.api.tokens import TokenSigner
from app.settings import Settings
from app.stores.redis_client import open_redis
from app.stores.redis_projection import RedisProjectionStore
from tests.support.api import SECRET
from tests.support.clock import ManualClock


@dataclass
class Instance:
    server: TestServer
    store: RedisProjectionStore
    url: str


@dataclass
class Fleet:
    settings: Settings
    instances: list[Instance]
    http: aiohttp.ClientSession
    clock: ManualClock | None

    @property
    def store(self) -> RedisProjectionStore:
        return self.instances[0].store

    def auth(self, user_id: int) -> dict[str, str]:
        now_s = (self.clock.now // 1000) if self.clock is not None else 2_000_000_000 - 7200
        return {"Authorization": "Bearer " + TokenSigner(SECRET).mint(user_id, now_s + 3600)}

    async def get(self, instance: int, path: str, user_id: int, **params: Any) -> tuple[int, dict[str, Any]]:
        query = {k: str(v) for k, v in params.items() if v is not None}
        url = self.instances[instance].url + path
        async with self.http.get(url, params=query, headers=self.auth(user_id)) as resp:
            return resp.status, await resp.json()

    async def walk(
        self, user_id: int, limit: int, folder: str = "main", route: Callable[[int], int] = lambda n: 0
    ) -> list[dict[str, Any]]:
        """Pages of one walk; page n is asked of instance route(n). Stops at a restart too (the
        caller asserts there was none)."""
        pages: list[dict[str, Any]] = []
        cursor = None
        for n in range(100_000):
            status, body = await self.get(
                route(n), "/v1/sessions", user_id, limit=limit, folder=folder, cursor=cursor
            )
            assert status == 200, body
            pages.append(body)
            cursor = body["next_cursor"]
            if cursor is None or not body["projection_complete"]:
                return pages
        raise AssertionError("a walk that never ends")


@contextlib.asynccontextmanager
async def fleet(
    settings: Settings,
    namespace: str,
    count: int,
    *,
    url: str | None = None,
    clock: ManualClock | None = None,
) -> AsyncIterator[Fleet]:
    settings = settings.replace(api_secret=SECRET, projection_namespace=namespace)
    instances: list[Instance] = []
    try:
        for _ in range(count):
            store = RedisProjectionStore(open_redis(url or settings.redis.redis_url), namespace)
            deps = Deps(projections=RedisProjectionReader(store))
            if clock is not None:
                deps.clock_ms = clock
            server = TestServer(create_app(settings, deps), host="127.0.0.1")
            await server.start_server()
            instances.append(Instance(server, store, str(server.make_url("")).rstrip("/")))
        async with aiohttp.ClientSession() as http:
            yield Fleet(settings, instances, http, clock)
    finally:
        if instances:
            await instances[0].store.delete_all()
        for instance in instances:
            await instance.server.close()
            await instance.store.client.aclose()
