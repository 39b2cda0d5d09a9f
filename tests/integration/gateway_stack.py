"""Gateway instances for integration tests: the query API app with its live stream, built by the
real wiring (app/gateway/wiring.py: Kafka frame source, presence, push producer) over a Stack's
topics, served in-process on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as redis
from aiohttp.test_utils import TestServer

from app.api import Deps, create_app
from app.api.sources import RedisProjectionReader
from app.api.stream import STREAM_KEY
from app.api.tokens import TokenSigner
from app.gateway.service import Gateway
from app.gateway.wiring import open_gateway
from app.sdk import LiveSessionList, SessionsClient
from app.sdk.stream import LiveStream
from app.settings import Settings
from app.stores.redis_projection import RedisProjectionStore
from tests.support.api import SECRET


def token(user_id: int) -> str:
    return TokenSigner(SECRET).mint(user_id, int(time.time()) + 3600)


@dataclass
class Instance:
    url: str
    gateway: Gateway
    settings: Settings


@contextlib.asynccontextmanager
async def gateway_instance(
    settings: Settings, extra: dict[str, Any] | None = None, **overrides: Any
) -> AsyncIterator[Instance]:
    """``extra``: more API services (e.g. the member directory's), as ``projector api`` adds them."""
    settings = settings.replace(api_secret=SECRET, api_fill_from_state="never", **overrides)
    client = redis.Redis.from_url(settings.redis.redis_url)
    store = RedisProjectionStore(client, settings.redis.projection_namespace)
    try:
        async with open_gateway(settings, client) as gateway:
            assert gateway is not None
            deps = Deps(
                projections=RedisProjectionReader(store), extra={**(extra or {}), STREAM_KEY: gateway}
            )
            server = TestServer(create_app(settings, deps), host="127.0.0.1")
            await server.start_server()
            try:
                yield Instance(str(server.make_url("")).rstrip("/"), gateway, settings)
            finally:
                await server.close()
    finally:
        await client.aclose()


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout: float, what: str) -> None:
    """Poll ``check`` until it holds (a condition on real servers), failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not met after {timeout}s: {what}")
        await asyncio.sleep(0.2)


async def assert_device_matches(
    api: SessionsClient, live: LiveSessionList, follow: LiveStream, badge: dict[str, Any], timeout: float = 60
) -> None:
    """A device following the stream reaches the version of ``badge`` (replay's badge record of
    its user) with that badge, and its folders equal a fresh walk of the same store."""
    version = badge["projection_mailbox_seq"]

    def arrived() -> bool:
        held = live.view.badge
        return live.view.version == version and held is not None and held.version == version

    await follow.until(arrived, timeout)
    held = live.view.badge
    assert held is not None and held.total_unread == badge["total_unread"], badge["user_id"]
    assert held.total_mention == badge["total_mention"], badge["user_id"]
    assert [dict(r) for r in live.main()] == (await api.walk("main", 50)).rows, badge["user_id"]
    assert [dict(r) for r in live.archived()] == (await api.walk("archived", 50)).rows, badge["user_id"]
