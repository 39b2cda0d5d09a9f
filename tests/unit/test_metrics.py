"""Prometheus metrics (issue 7): the worker's are pulled from WorkerCore (in-memory ports), the
API's from its snapshot layer; every named metric is exposed and moves when it should."""

from __future__ import annotations

import asyncio

from app.api import Deps, create_app
from app.api.sources import MemoryProjectionReader
from app.metrics import (
    API_METRICS,
    REBUILD_METRICS,
    WORKER_METRICS,
    RebuildMetrics,
    WorkerMetrics,
    names,
    sample,
)
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from tests.support.api import SETTINGS, T0, Api
from tests.support.builders import CONV_A, StreamBuilder
from tests.support.clock import ManualClock
from tests.support.metrics import metrics_text, scrape
from tests.support.mirror_writer import MirrorCassandra, MirrorWriter
from tests.support.rows import flush, make_row
from tests.support.worker import RecordingOutbox, make_core, records


def test_worker_metrics_move_with_the_core() -> None:
    s = StreamBuilder(lanes=2)
    first = s.message(7, 1, lane=0)
    second = s.message(7, 2, lane=1)
    s.marker(0, 2)  # lane 1 has not reported: both entries wait above hi = 0
    waiting = [b"{oops", *s.lines]
    messages = [line for line in s.lines if b'"message"' in line]
    s.lines = []
    closing = s.close()
    tables, projections, outbox, clock = (
        MemoryTables(),
        InMemoryProjectionStore(),
        RecordingOutbox(),
        ManualClock(),
    )
    core = make_core(2, tables, InMemoryMessageStore(), projections, outbox, clock)
    metrics = WorkerMetrics()
    core.metrics = metrics

    text = scrape(metrics, core)
    assert set(WORKER_METRICS) <= names(text)
    assert sample(text, "projector_entries_in_total") == 0

    asyncio.run(core.on_records(records(waiting)))
    text = scrape(metrics, core)
    assert sample(text, "projector_entries_in_total") == 3  # markers are not entries
    assert sample(text, "projector_entries_dead_lettered_total") == 1
    assert sample(text, "projector_entries_pending") == 2
    assert sample(text, "projector_watermark_lag", [("partition", "0")]) == second - 0
    assert sample(text, "projector_entries_applied_total") == 0

    asyncio.run(core.on_records(records(closing, len(waiting))))
    asyncio.run(core.flush_all())
    text = scrape(metrics, core)
    assert sample(text, "projector_entries_applied_total") == 2
    assert sample(text, "projector_entries_pending") == 0
    assert sample(text, "projector_watermark_lag", [("partition", "0")]) == 0
    assert sample(text, "projector_flushes_total") == 1
    assert sample(text, "projector_projection_writes_total") == 1  # two entries, one row write
    assert sample(text, "projector_compression_ratio") == 2.0
    assert sample(text, "projector_frames_emitted_total") == 2  # SESSION_DELTA + BADGE_UPDATE
    assert sample(text, "projector_flush_latency_seconds_count") == 1

    asyncio.run(core.on_records(records(messages, len(waiting) + len(closing))))  # again: duplicates
    text = scrape(metrics, core)
    assert sample(text, "projector_entries_duplicate_total") == 2
    assert sample(text, "projector_intake_gaps_refused_total") == 0
    # The same records again (a seek back): skipped by the offset rule, not even duplicates.
    asyncio.run(core.on_records(records(messages, len(waiting) + len(closing))))
    text = scrape(metrics, core)
    assert sample(text, "projector_intake_records_skipped_total") == 2
    assert sample(text, "projector_entries_duplicate_total") == 2
    # A batch that does not continue the log: refused, counted, nothing applied.
    asyncio.run(core.on_records(records(messages, 50)))
    text = scrape(metrics, core)
    assert sample(text, "projector_intake_gaps_refused_total") == 1
    assert sample(text, "projector_entries_duplicate_total") == 2
    assert sample(text, "projector_entries_in_total") == 5
    assert sample(text, "projector_entries_applied_total") == 2
    assert first < second
    # A second scrape with no new work adds nothing (deltas, not totals, go into the counters).
    assert sample(scrape(metrics, core), "projector_entries_in_total") == 5


def test_mirror_failures_owed_rows_and_their_restaging_are_counted() -> None:
    s = StreamBuilder()
    s.message(7, 1)
    s.message(8, 1)
    store = InMemoryMessageStore()
    tables, cassandra = MemoryTables(), MirrorCassandra()
    down = MirrorWriter(cassandra)
    down.down = True
    core = make_core(1, tables, store, InMemoryProjectionStore(), RecordingOutbox(), ManualClock())
    core.state_writer = down
    metrics = WorkerMetrics()

    async def run() -> None:
        await core.on_records(records(s.close()))
        while not core.stats.state_write_failures:  # the round the batch started
            await asyncio.sleep(0.01)
        await core.flush_all()
        assert core.mirror is not None
        await core.mirror.close()  # killed

    asyncio.run(run())
    text = scrape(metrics, core)
    assert sample(text, "projector_state_writes_total") == 0
    assert sample(text, "projector_state_write_failures_total") == 2  # the batch's round, the stop's drain
    assert sample(text, "projector_state_owed_rows_total") == 2  # two rows went to the changelog owing

    restarted = make_core(1, tables, store, InMemoryProjectionStore(), RecordingOutbox(), ManualClock())
    restarted.state_writer = MirrorWriter(cassandra)
    asyncio.run(restarted.restore_assigned([0]))
    asyncio.run(restarted.flush_all())
    text = scrape(WorkerMetrics(), restarted)
    assert sample(text, "projector_state_restaged_rows_total") == 2
    assert sample(text, "projector_state_writes_total") == 2
    assert set(cassandra.state) == {(7, CONV_A), (8, CONV_A)}


def test_revoked_partitions_stop_reporting_watermark_lag() -> None:
    s = StreamBuilder(lanes=2)
    s.message(7, 1, lane=1)
    s.marker(0, 1)
    store = InMemoryMessageStore()
    core = make_core(2, MemoryTables(), store, InMemoryProjectionStore(), RecordingOutbox(), ManualClock())
    metrics = WorkerMetrics()
    asyncio.run(core.on_records(records(s.lines)))
    assert 'partition="0"' in scrape(metrics, core)
    asyncio.run(core.release([0]))
    core.forget([0])
    assert 'partition="0"' not in scrape(metrics, core)


def test_rebuild_progress_moves() -> None:
    metrics = RebuildMetrics()
    text = metrics_text(metrics.registry)
    assert set(REBUILD_METRICS) <= names(text)
    metrics.update(3, 4)
    text = metrics_text(metrics.registry)
    assert sample(text, "projector_rebuild_progress_ratio") == 0.75
    assert sample(text, "projector_rebuild_work_done") == 3


async def test_api_metrics_count_snapshot_hits_loads_evictions_and_page_latency() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    store = InMemoryProjectionStore()
    clock = ManualClock(T0)
    app = create_app(SETTINGS, Deps(projections=MemoryProjectionReader(store), clock_ms=clock))
    async with TestClient(TestServer(app)) as client:
        api = Api(client, store, clock, "")

        async def scraped() -> str:
            async with client.get("/metrics") as resp:  # no token
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/plain")
                return await resp.text()

        text = await scraped()
        assert set(API_METRICS) <= names(text)
        assert sample(text, "projector_snapshot_loads_total") == 0
        # Cache bound 5,000 rows: two users of 3,000 rows cannot both be held.
        for user in (1, 2):
            await store.write([flush(user, [make_row(user, n, act=n) for n in range(1, 3001)], 5, 0)])
        _, a1 = await api.get("/v1/sessions", user_id=1, limit=10)
        await api.get("/v1/sessions", user_id=1, limit=10, cursor=a1["next_cursor"])  # a hit
        await api.get("/v1/sessions", user_id=2, limit=10)  # a load that evicts user 1
        text = await scraped()
        assert sample(text, "projector_snapshot_loads_total") == 2
        assert sample(text, "projector_snapshot_hits_total") == 1
        assert sample(text, "projector_snapshot_evictions_total") == 1
        assert sample(text, "projector_page_latency_seconds_count") == 3
        async with client.get("/v1/sessions") as resp:  # refused: no token, no page observed
            assert resp.status == 401
        assert sample(await scraped(), "projector_page_latency_seconds_count") == 3


def test_each_api_app_has_its_own_registry() -> None:
    one = create_app(SETTINGS, Deps(projections=MemoryProjectionReader(InMemoryProjectionStore())))
    two = create_app(SETTINGS, Deps(projections=MemoryProjectionReader(InMemoryProjectionStore())))
    from app.api.http import CONTEXT

    assert one[CONTEXT].metrics.registry is not two[CONTEXT].metrics.registry
