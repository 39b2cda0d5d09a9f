"""The Redis store rides out failures that pass (retry budget, redis-py's backoff), on real
servers: a server that comes up late, one that never does, scripts lost on every cluster master."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis.asyncio as redis
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from app.domain.badge import Badge
from app.settings import Settings
from app.stores.redis_projection import ProjectionStoreError, RedisProjectionStore, is_transient
from tests.contract.conftest import MakeRedisStore
from tests.integration.stack import free_port
from tests.support import redis_cluster
from tests.support.store_rows import conv, flush

pytestmark = pytest.mark.timeout(180)


def test_what_counts_as_a_failure_that_passes() -> None:
    assert is_transient(RedisConnectionError("Connection reset by peer"))
    assert is_transient(ClusterDownError("CLUSTERDOWN The cluster is down"))
    assert is_transient(TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"))
    assert is_transient(MovedError("3999 127.0.0.1:7102"))
    assert is_transient(OSError("network is unreachable"))
    assert not is_transient(AuthenticationError("invalid password"))  # a retry only repeats it
    assert not is_transient(ResponseError("WRONGTYPE Operation against a key holding the wrong kind"))
    assert not is_transient(NoScriptError("NOSCRIPT"))  # handled apart: load and re-send at once


@pytest.fixture
def late_server(tmp_path: Path) -> Iterator[Callable[[], None]]:
    """A port with no server yet; calling the fixture's value starts redis-server on it."""
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        procs.append(
            subprocess.Popen(
                [
                    "redis-server",
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    start.port = port  # type: ignore[attr-defined]
    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.integration
async def test_a_write_waits_for_a_server_that_comes_up_within_the_budget(
    late_server: Callable[[], None],
) -> None:
    client = redis.Redis(port=late_server.port, socket_connect_timeout=2)  # type: ignore[attr-defined]
    store = RedisProjectionStore(client, "late", retry_budget_s=120)
    try:
        writing = asyncio.create_task(store.write([flush(7, 3, [conv(1)], Badge(1, 0, 0))]))
        await asyncio.sleep(1.0)  # the write is failing and backing off meanwhile
        assert not writing.done()
        late_server()
        assert await writing == [0]
        assert (await store.load(7)).total_unread == 1
        assert await store.versions([7]) == [3]
    finally:
        await client.aclose()


@pytest.mark.integration
async def test_a_write_gives_up_after_the_budget_with_a_clear_error(late_server: Callable[[], None]) -> None:
    client = redis.Redis(port=late_server.port, socket_connect_timeout=2)  # type: ignore[attr-defined]
    store = RedisProjectionStore(client, "never", retry_budget_s=0.5)
    try:
        with pytest.raises(ProjectionStoreError, match="unreachable during write: writing user 7"):
            await store.write([flush(7, 3, [conv(1)])])
        with pytest.raises(ProjectionStoreError, match="unreachable during versions"):
            await store.versions([7])
    finally:
        await client.aclose()


@pytest.mark.integration
async def test_cluster_writes_reload_scripts_every_master_lost(make_cluster_store: MakeRedisStore) -> None:
    # As after a failover to a replica that never loaded them: every master answers NOSCRIPT.
    store = make_cluster_store()
    await store.write([flush(u, 1, [conv(1)]) for u in range(50)])
    for node in redis_cluster.nodes():
        if node.is_master and not node.failed:
            with redis_cluster.client(node.port) as c:
                c.script_flush()
    assert await store.write([flush(u, 2, [conv(2)]) for u in range(50)]) == [1] * 50
    assert await store.versions(list(range(50))) == [2] * 50


@pytest.mark.integration
async def test_a_fresh_cluster_store_from_settings_writes_and_reads_atomically(
    unique_name: Callable[..., str],
) -> None:
    # Its first command is a read: the cluster client starts (reads the slot map) inside it.
    # (redis-py 8.1's asyncio cluster MULTI ran its commands on a throwaway event loop here.)
    settings = Settings.build(redis_url=redis_cluster.URL)
    store = RedisProjectionStore.from_settings(settings.redis, unique_name("proj"))
    try:
        assert (await store.load(7)).projection_mailbox_seq == 0
        assert await store.write([flush(7, 4, [conv(1), conv(2)], Badge(2, 1, 0))]) == [0]
        got = await store.load(7)
        assert (got.projection_mailbox_seq, got.total_unread, sorted(got.rows)) == (4, 2, [conv(1), conv(2)])
        some = await store.load_rows(7, [conv(2), conv(9)])
        assert some.rows[conv(9)] is None and some.rows[conv(2)] == got.rows[conv(2)]
        assert (await store.load_rows(7, [])).total_mention == 1
    finally:
        await store.delete_all()
        await store.aclose()
