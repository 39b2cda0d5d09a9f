"""The fault tooling issue 18 builds on: a real Redis connection through Toxiproxy (built by the
project, tests/support/toxiproxy.py), whose `latency` toxic delays it and `reset_peer` toxic resets it;
and the projection store riding out the reset within its retry budget."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.domain.badge import Badge
from app.settings import Settings
from app.stores.redis_projection import ProjectionStoreError, RedisProjectionStore
from tests.support.store_rows import conv, flush
from tests.support.toxiproxy import Proxy, Toxiproxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NO_RETRY = Retry(NoBackoff(), 0)


@pytest.fixture
def toxi(tmp_path: Path) -> Iterator[Toxiproxy]:
    with Toxiproxy.start(tmp_path) as server:
        yield server


@pytest.fixture
def redis_proxy(toxi: Toxiproxy, settings: Settings) -> Proxy:
    target = (
        Settings().redis.redis_url
        if settings.redis.redis_url.startswith("redis+")
        else settings.redis.redis_url
    )
    host_port = target.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1]
    return toxi.proxy("redis", host_port)


def test_a_redis_connection_goes_through_the_proxy_and_feels_its_toxics(
    toxi: Toxiproxy, redis_proxy: Proxy, unique_name: Callable[..., str]
) -> None:
    key = unique_name("toxi")
    direct = redis.Redis.from_url(Settings().redis.redis_url)
    # No client-side retries: each call shows exactly what the toxic did to it.
    through = redis.Redis(host=redis_proxy.host, port=redis_proxy.port, socket_timeout=30, retry=NO_RETRY)
    try:
        # Through the proxy it is the real server: what one side writes, the other reads.
        assert through.set(key, b"via-proxy")
        assert direct.get(key) == b"via-proxy"
        (me,) = [c for c in through.client_list() if c["name"] == "" and c["cmd"] == "client|list"]
        assert me["addr"].split(":")[0] == "127.0.0.1"  # the server sees toxiproxy's connection

        # latency: every reply waits at least 1.5 s (a floor set by the toxic, not a guess).
        toxi.add_toxic(redis_proxy, "latency", {"latency": 1500, "jitter": 0})
        impatient = redis.Redis(
            host=redis_proxy.host, port=redis_proxy.port, socket_timeout=0.3, retry=NO_RETRY
        )
        try:
            with pytest.raises(redis.TimeoutError):
                impatient.get(key)
        finally:
            impatient.close()
        started = time.monotonic()
        assert through.get(key) == b"via-proxy"
        assert time.monotonic() - started >= 1.5
        toxi.remove_toxic(redis_proxy, "latency_downstream")

        # reset_peer: the proxy answers the next bytes with a TCP RST.
        toxi.add_toxic(redis_proxy, "reset_peer", {"timeout": 0}, stream="upstream")
        with pytest.raises(redis.ConnectionError):
            through.get(key)
        toxi.remove_toxic(redis_proxy, "reset_peer_upstream")
        assert through.get(key) == b"via-proxy"  # a new connection, healthy again

        # A proxy disabled is a server gone: refused.
        toxi.disable(redis_proxy)
        with pytest.raises(redis.ConnectionError):
            through.get(key)
        toxi.enable(redis_proxy)
        assert through.get(key) == b"via-proxy"
        assert direct.get(key) == b"via-proxy"
    finally:
        direct.delete(key)
        direct.close()
        through.close()


async def test_the_store_rides_out_resets_within_its_budget_and_reports_them_after(
    toxi: Toxiproxy, redis_proxy: Proxy, unique_name: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="app.stores.redis_projection")
    client = aredis.Redis(host=redis_proxy.host, port=redis_proxy.port, socket_timeout=10)
    store = RedisProjectionStore(client, unique_name("toxi"), retry_budget_s=120)
    try:
        assert await store.write([flush(7, 1, [conv(1)])]) == [0]
        toxi.add_toxic(redis_proxy, "reset_peer", {"timeout": 0}, stream="upstream")
        writing = asyncio.create_task(store.write([flush(7, 2, [conv(2)], Badge(4, 0, 0))]))
        deadline = time.monotonic() + 60
        while not any(
            "reset" in r.getMessage().lower() or "closed" in r.getMessage().lower() for r in caplog.records
        ):
            assert time.monotonic() < deadline and not writing.done(), "the write never met the reset"
            await asyncio.sleep(0.05)
        toxi.remove_toxic(redis_proxy, "reset_peer_upstream")
        assert await writing == [1]
        assert (await store.load(7)).total_unread == 4
        # With no budget the same reset is one clear error.
        toxi.add_toxic(redis_proxy, "reset_peer", {"timeout": 0}, stream="upstream")
        store.retry_budget_s = 0
        with pytest.raises(ProjectionStoreError, match="unreachable during write"):
            await store.write([flush(7, 3, [conv(3)])])
    finally:
        toxi.reset()
        store.retry_budget_s = 0
        await store.delete_all()
        await client.aclose()
