"""The query API's test setting: the token secret, a user, a start time, the settings, and a
client for the API served by aiohttp's TestServer."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aiohttp.test_utils import TestClient

from app.api.tokens import TokenSigner
from app.settings import Settings
from app.stores.memory_projection import InMemoryProjectionStore
from tests.support.clock import ManualClock

SECRET = "unit-test-secret-0123456789-abcdefghij"
ME = 42
T0 = 1_800_000_000_000  # ms
SETTINGS = Settings.build(
    api_secret=SECRET, api_fill_from_state="never", api_snapshot_cache_rows=5000, api_rate_limit_per_s=0
)


@dataclass
class Api:
    client: TestClient[Any, Any]
    store: InMemoryProjectionStore
    clock: ManualClock
    token: str

    def auth(self, user_id: int = ME, ttl_s: int = 3600) -> dict[str, str]:
        exp = self.clock.now // 1000 + ttl_s
        return {"Authorization": "Bearer " + TokenSigner(SECRET).mint(user_id, exp)}

    async def get(self, path: str, user_id: int = ME, **params: Any) -> tuple[int, dict[str, Any]]:
        query = {k: str(v) for k, v in params.items() if v is not None}
        async with self.client.get(path, params=query, headers=self.auth(user_id)) as resp:
            return resp.status, await resp.json()

    async def walk(self, limit: int, folder: str = "main", user_id: int = ME) -> list[dict[str, Any]]:
        pages: list[dict[str, Any]] = []
        cursor = None
        while True:
            status, body = await self.get("/v1/sessions", user_id, limit=limit, folder=folder, cursor=cursor)
            assert status == 200, body
            pages.append(body)
            cursor = body["next_cursor"]
            if cursor is None:
                return pages


def token(user_id: int) -> str:
    """A token for `user_id`, valid for an hour of real time (servers in other processes)."""
    return TokenSigner(SECRET).mint(user_id, int(time.time()) + 3600)
