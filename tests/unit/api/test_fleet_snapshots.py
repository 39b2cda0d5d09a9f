"""Issue 32 on the in-memory store: two apps over one store share walks as two API processes over
one Redis do (the Redis and Redis Cluster cases: tests/integration/test_api_fleet.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from app.api import Deps, create_app
from app.api.sources import MemoryProjectionReader
from app.domain.badge import Badge
from app.domain.flush import Correction
from app.stores.memory_projection import InMemoryProjectionStore
from tests.support.api import SETTINGS, T0, Api
from tests.support.clock import ManualClock
from tests.support.rows import cid, flush, make_row

ME = 42


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Api, Api]]:
    store = InMemoryProjectionStore()
    clock = ManualClock(T0)
    apis = []
    for _ in range(2):
        client: TestClient[Any, Any] = TestClient(
            TestServer(create_app(SETTINGS, Deps(projections=MemoryProjectionReader(store), clock_ms=clock)))
        )
        await client.start_server()
        apis.append(Api(client, store, clock, ""))
    try:
        yield apis[0], apis[1]
    finally:
        for api in apis:
            await api.client.close()


async def test_a_cursor_minted_by_one_app_is_honoured_by_the_other(pair: tuple[Api, Api]) -> None:
    a, b = pair
    await a.store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 11)], 5, 1)])
    _, first = await a.get("/v1/sessions", limit=4)
    _, second = await b.get("/v1/sessions", limit=4, cursor=first["next_cursor"])
    _, third = await a.get("/v1/sessions", limit=4, cursor=second["next_cursor"])
    pages = [first, second, third]
    assert [r["conversation_id"] for p in pages for r in p["items"]] == [cid(n) for n in range(10, 0, -1)]
    assert {p["snapshot_revision"] for p in pages} == {1} and all(p["projection_complete"] for p in pages)


async def test_a_frozen_row_the_store_lost_restarts_the_walk_rather_than_skip_it(
    pair: tuple[Api, Api],
) -> None:
    a, b = pair
    await a.store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 11)], 5, 1)])
    _, first = await a.get("/v1/sessions", limit=4)
    # The projection lost row 3 (rewritten without it, same structure version): b cannot place
    # it in the frozen order, so it does not adopt the snapshot; the walk restarts.
    await a.store.delete_all()
    await a.store.write([flush(ME, [make_row(ME, n, act=n) for n in range(1, 11) if n != 3], 6, 1)])
    _, second = await b.get("/v1/sessions", limit=4, cursor=first["next_cursor"])
    assert second["projection_complete"] is False and second["snapshot_revision"] == 2
    # a still holds the frozen rows: its own cursor goes on (the rows it froze, no gap).
    _, held = await a.get("/v1/sessions", limit=4, cursor=first["next_cursor"])
    assert held["projection_complete"] is True and held["snapshot_revision"] == 1


async def test_a_correction_is_served_by_both_apps_next_walk(pair: tuple[Api, Api]) -> None:
    a, b = pair
    drifted = [make_row(ME, n, act=n, unread=9) for n in range(1, 6)]
    await a.store.write([flush(ME, drifted, 5, 1)])
    for api in (a, b):
        assert {r["unread_count"] for r in (await api.walk(2))[0]["items"]} == {9}
    good = [make_row(ME, n, act=n, unread=1) for n in range(1, 6)]
    assert await a.store.correct([Correction(ME, 5, good, Badge(5, 0, 0))]) == [True]
    for api in (a, b):
        pages = await api.walk(2)
        assert {r["unread_count"] for p in pages for r in p["items"]} == {1}
        assert pages[0]["snapshot_revision"] == 2  # one new snapshot, shared by both
