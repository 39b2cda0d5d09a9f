"""Prometheus endpoints on the real servers (issue 7): the worker's own /metrics server
(PROJECTOR_WORKER_METRICS_PORT) and the API's GET /metrics, scraped while traffic flows; every
named metric is present and moves when it should.

Not moved here: the unread audit's metrics (``projector_unread_*``: no round runs within this
test at the default interval; tests/integration/test_unread_audit.py moves them) and the rebuild
progress gauges (they live in the rebuild tool's process, on its own `--metrics-port`:
tests/integration/test_rebuild_from_timestamp.py scrapes them moving)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from app.api import Deps, create_app
from app.api.sources import RedisProjectionReader
from app.api.tokens import TokenSigner
from app.metrics import API_METRICS, WORKER_METRICS, names, sample
from app.stores.redis_projection import RedisProjectionStore
from tests.integration.stack import Stack, free_port, scrape_until
from tests.support.api import SECRET
from tests.support.builders import CONV_B, StreamBuilder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


async def test_worker_and_api_metrics_are_scraped_and_move(make_stack: Callable[..., Stack]) -> None:
    port = free_port()
    stack = make_stack("metrics", PROJECTOR_WORKER_METRICS_PORT=str(port))
    url = f"http://127.0.0.1:{port}/metrics"
    stack.start_worker()
    alive = stack.alive()
    text = await scrape_until(url, lambda t: set(WORKER_METRICS) <= names(t), 180, alive)
    assert sample(text, "projector_entries_in_total") == 0

    # Lane 1 has not reported: its entries wait above the watermark.
    s = StreamBuilder(lanes=2)
    s.message(7, 1, lane=0)
    s.message(8, 1, conv=CONV_B, lane=0)
    s.message(7, 2, lane=1)
    s.message(8, 2, conv=CONV_B, lane=1)
    s.marker(0, s.seq)
    entries = [line for line in s.lines if b'"message"' in line]
    await stack.produce([*s.lines, b"{oops"])  # no user: goes to every partition, dead-lettered
    text = await scrape_until(url, lambda t: sample(t, "projector_entries_in_total") >= 6, 120, alive)
    # At least: delivery is at least once (a rebalance while the worker settles in may re-read an
    # uncommitted record and dead-letter it again).
    assert sample(text, "projector_entries_dead_lettered_total") >= stack.settings.topics.topic_partitions
    assert sample(text, "projector_entries_pending") >= 1
    lags = [sample(text, "projector_watermark_lag", [("partition", str(p))]) for p in range(2)]
    assert max(lags) >= 1

    s.lines = []
    await stack.produce(s.close())  # every lane reports: everything is applied, then flushed
    text = await scrape_until(
        url,
        lambda t: (
            sample(t, "projector_entries_applied_total") == 4
            and sample(t, "projector_frames_emitted_total") >= 4
        ),
        120,
        alive,
    )
    assert sample(text, "projector_entries_pending") == 0
    assert all(sample(text, "projector_watermark_lag", [("partition", str(p))]) == 0 for p in range(2))
    assert sample(text, "projector_flushes_total") >= 1
    assert sample(text, "projector_projection_writes_total") >= 2
    assert sample(text, "projector_compression_ratio") > 0
    assert sample(text, "projector_flush_latency_seconds_count") >= 1

    await stack.produce(entries)  # again: every one is a duplicate
    text = await scrape_until(url, lambda t: sample(t, "projector_entries_duplicate_total") >= 4, 120, alive)
    assert sample(text, "projector_entries_applied_total") == 4  # a re-read is a duplicate, never applied
    assert sample(text, "projector_unread_drift_ratio") == 0  # no audit round yet: exported at 0

    # The API over what the worker wrote; a cache bound of one row: each load evicts the other user.
    settings = stack.settings.replace(api_secret=SECRET, api_snapshot_max_rows=1, api_snapshot_cache_rows=1)
    store = RedisProjectionStore.from_settings(settings.redis, settings.redis.projection_namespace)
    app = create_app(settings, Deps(projections=RedisProjectionReader(store)))
    try:
        async with TestClient(TestServer(app)) as client:

            async def api_scrape() -> str:
                async with client.get("/metrics") as resp:
                    assert resp.status == 200
                    return await resp.text()

            async def page(user_id: int) -> dict[str, Any]:
                bearer = TokenSigner(SECRET).mint(user_id, int(time.time()) + 600)
                auth = {"Authorization": "Bearer " + bearer}
                async with client.get("/v1/sessions", headers=auth) as resp:
                    assert resp.status == 200
                    body: dict[str, Any] = await resp.json()
                    return body

            before = await api_scrape()
            assert set(API_METRICS) <= names(before)
            assert sample(before, "projector_snapshot_loads_total") == 0
            assert (await page(7))["items"][0]["unread_count"] == 2
            await page(7)  # the held snapshot is current: a hit
            await page(8)  # a load; the bound evicts user 7
            after = await api_scrape()
            assert sample(after, "projector_snapshot_loads_total") == 2
            assert sample(after, "projector_snapshot_hits_total") == 1
            assert sample(after, "projector_snapshot_evictions_total") == 1
            assert sample(after, "projector_page_latency_seconds_count") == 3
    finally:
        await store.aclose()
    stack.stop_workers()
