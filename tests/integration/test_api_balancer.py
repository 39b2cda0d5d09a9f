"""Issue 32, item 2: HAProxy round robin (Debian's haproxy, scripts/tools.d/haproxy.sh) in front of
three `projector api` processes on one projection store. Walks through the balancer (20 small
users at 3 and 7 a page, a 5,000-conversation user at 50 and at 3) equal one instance's walks,
and an instance SIGKILLed mid-walk and one added mid-walk change nothing for the walk in flight
(no restart, no duplicate, no gap)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as redis

from app.domain.listing import Folder
from app.settings import Settings
from app.stores.redis_projection import RedisProjectionStore
from tests.integration.stack import free_port
from tests.support.api import SECRET, token
from tests.support.balancer import Balancer
from tests.support.rows import expected_order, flush, mixed_rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
BIG = 7_000_001
SMALL = [7_000_100 + n for n in range(20)]


@pytest.fixture
def schema(servers: Settings, cassandra_session: Any) -> Iterator[str]:
    from app.cli.bootstrap import ensure_cassandra_schema

    keyspace = f"t_lb_{uuid.uuid4().hex[:12]}"
    ensure_cassandra_schema(servers.cassandra, keyspace=keyspace)
    yield keyspace
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")


async def start_apis(
    settings: Settings, schema: str, ports: list[int], logs: Path
) -> list[subprocess.Popen[str]]:
    env = {
        **os.environ,
        **settings.as_env(),
        "PROJECTOR_API_SECRET": SECRET,
        "PROJECTOR_CASSANDRA_KEYSPACE": schema,
        "PROJECTOR_API_FILL_FROM_STATE": "never",
        "PROJECTOR_GATEWAY_ENABLED": "false",
        "PROJECTOR_LOG_LEVEL": "WARNING",
        "PROJECTOR_API_RATE_LIMIT_PER_S": "0",
    }
    procs = []
    for n, port in enumerate(ports):
        with (logs / f"api{n}.log").open("w") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "app", "api", "--host", "127.0.0.1", "--port", str(port)],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
            )
    for n, proc in enumerate(procs):
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=120)
        assert re.search(r"http://127\.0\.0\.1:\d+", line), (
            n,
            line,
            (logs / f"api{n}.log").read_text()[-2000:],
        )
    return procs


async def walk(
    http: aiohttp.ClientSession,
    base: str,
    user_id: int,
    limit: int,
    folder: str,
    hook: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    pages: list[dict[str, Any]] = []
    cursor = None
    headers = {"Authorization": f"Bearer {token(user_id)}"}
    while True:
        params = {"limit": str(limit), "folder": folder, **({"cursor": cursor} if cursor else {})}
        async with http.get(f"{base}/v1/sessions", params=params, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            pages.append(await resp.json())
        if hook is not None:
            hook(len(pages))
        cursor = pages[-1]["next_cursor"]
        if cursor is None or not pages[-1]["projection_complete"]:  # the end, or a restart
            return pages


def summary(pages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (p["items"], p["snapshot_revision"], p["projection_complete"], p["projection_mailbox_seq"])
        for p in pages
    ]


def ids(pages: list[dict[str, Any]]) -> list[str]:
    return [r["conversation_id"] for p in pages for r in p["items"]]


async def requests_served(http: aiohttp.ClientSession, port: int) -> float:
    async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    pattern = r'projector_api_requests_total\{code="200",method="GET",route="/v1/sessions"\} ([0-9.e+]+)'
    return sum(float(m) for m in re.findall(pattern, text))


async def test_round_robin_walks_survive_an_instance_killed_and_one_added_mid_walk(
    servers: Settings, schema: str, unique_name: Callable[..., str], tmp_path: Path
) -> None:
    namespace = unique_name("lb")
    settings = servers.replace(projection_namespace=namespace)
    client = redis.Redis.from_url(settings.redis.redis_url)
    store = RedisProjectionStore(client, namespace)
    big_rows = mixed_rows(BIG, 5000, seed=32)
    small_rows = {u: mixed_rows(u, 10 + 4 * n, seed=n) for n, u in enumerate(SMALL)}
    for start in range(0, 5000, 1000):
        await store.write([flush(BIG, big_rows[start : start + 1000], start // 1000 + 1, 2)])
    await store.write([flush(u, rows, 3, 1) for u, rows in small_rows.items()])
    ports = [free_port() for _ in range(4)]  # three in rotation, one spare added mid-walk
    procs = await start_apis(settings, schema, ports, tmp_path)
    try:
        with Balancer.start(tmp_path, ports[:3], spare=ports[3]) as lb:
            async with aiohttp.ClientSession() as http:
                direct = f"http://127.0.0.1:{ports[0]}"
                pages_walked = 0
                # Many small users at 3 and 7 rows a page: balanced walks equal one instance's.
                for limit in (3, 7):
                    for user, rows in small_rows.items():
                        for folder in Folder:
                            balanced = await walk(http, lb.url, user, limit, folder.value)
                            single = await walk(http, direct, user, limit, folder.value)
                            assert summary(balanced) == summary(single), (user, limit, folder)
                            assert ids(balanced) == expected_order(rows, folder)
                            pages_walked += len(balanced)
                served_before = [await requests_served(http, p) for p in ports[:3]]
                assert all(n > 0 for n in served_before), served_before  # all three take pages

                # The 5,000-conversation user at 50 a page: api1 is SIGKILLed after page 20, the
                # spare joins after page 50 (the walk's requests keep going through the balancer).
                events: list[str] = []

                def chaos(page: int) -> None:
                    if page == 20:
                        procs[1].send_signal(signal.SIGKILL)
                        events.append("killed api1")
                    if page == 50:
                        lb.enable_spare()
                        events.append("added spare")

                big = await walk(http, lb.url, BIG, 50, "main", hook=chaos)
                assert events == ["killed api1", "added spare"]
                single = await walk(http, direct, BIG, 50, "main")
                assert summary(big) == summary(single)
                assert ids(big) == expected_order(big_rows, Folder.MAIN)
                assert {p["snapshot_revision"] for p in big} == {1}
                restarts = sum(not p["projection_complete"] for p in big)
                assert restarts == 0
                assert len(ids(big)) == len(set(ids(big)))
                pages_walked += len(big)
                assert await requests_served(http, ports[3]) > 0  # the added instance served pages
                # And at 3 a page (~1,400 pages) over the three instances left in the rotation.
                for folder in Folder:
                    balanced = await walk(http, lb.url, BIG, 3, folder.value)
                    single = await walk(http, direct, BIG, 3, folder.value)
                    assert summary(balanced) == summary(single), folder
                    assert ids(balanced) == expected_order(big_rows, folder)
                    pages_walked += len(balanced)
                assert lb.servers_up()["api1"].startswith("DOWN")
                print(f"\nbalanced pages: {pages_walked} (the 5,000 walk: {len(big)}), restarts: {restarts}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        await store.delete_all()
        await client.aclose()
