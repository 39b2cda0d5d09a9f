"""Issue 32 on the real servers: several API apps on one projection store (a single Redis and
the Redis Cluster) behave as one service: one rate limit for the fleet; page walks any instance
continues (a cursor minted by one is honoured by another, J-5 unchanged); a correction (the
console's reconcile, the audit) is seen by every instance's next walk."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app.api.http import CONTEXT
from app.domain.badge import Badge
from app.domain.flush import Correction
from app.domain.listing import Folder
from app.settings import Settings
from tests.support import redis_cluster
from tests.support.clock import ManualClock
from tests.support.fleet import Fleet, fleet
from tests.support.rows import cid, expected_order, flush, make_row, mixed_rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

T0 = 1_800_000_000_000
ME = 3232


@pytest.fixture(params=["redis", "cluster"])
def store_url(request: pytest.FixtureRequest, servers: Settings) -> Iterator[str]:
    if request.param == "cluster":
        redis_cluster.require_healthy()
        yield redis_cluster.URL
    else:
        yield servers.redis.redis_url


async def test_two_instances_enforce_the_configured_rate_not_twice_it(
    servers: Settings, store_url: str, unique_name: Callable[..., str]
) -> None:
    clock = ManualClock(T0)  # both instances' clock: the refill is the test's to move
    settings = servers.replace(api_rate_limit_per_s=2.0, api_rate_limit_burst=10)
    async with fleet(settings, unique_name("rate"), 2, url=store_url, clock=clock) as f:
        await f.store.write([flush(ME, [make_row(ME, 1, act=1)], 1, 1)])
        statuses = [(await f.get(n % 2, "/v1/badge", ME))[0] for n in range(30)]
        # One bucket of 10 for the fleet; per-process buckets let 20 through.
        assert statuses == [200] * 10 + [429] * 20, statuses
        assert (await f.get(1, "/v1/badge", ME + 1))[0] == 200  # another user's bucket is full
        status, body = await f.get(0, "/v1/badge", ME)
        assert status == 429 and body["error"]["code"] == "rate_limited"
        clock.now += 1_000  # 2 tokens a second, for the fleet
        assert [(await f.get(n % 2, "/v1/badge", ME))[0] for n in range(4)] == [200, 200, 429, 429]
        clock.now += 60_000  # a long pause refills to the burst, no more
        assert sum([(await f.get(n % 2, "/v1/badge", ME))[0] == 200 for n in range(14)]) == 10
        # The clock of one instance behind the other's adds no token (the bucket's time only moves on).
        clock.now -= 30_000
        assert [(await f.get(n % 2, "/v1/badge", ME))[0] for n in range(3)] == [429] * 3
        metrics = await f.http.get(f.instances[0].url + "/metrics")
        text = await metrics.text()
        assert "projector_api_rate_limited_total" in text


# -- walks any instance continues ------------------------------------------------------------------


def ids(pages: list[dict[str, Any]]) -> list[str]:
    return [str(r["conversation_id"]) for p in pages for r in p["items"]]


def summary(pages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What a walk's pages say, cursors aside (a cursor names its snapshot: equal snapshots give
    equal cursors anyway)."""
    return [
        (
            p["items"],
            p["snapshot_revision"],
            p["projection_complete"],
            p["projection_mailbox_seq"],
            p["truncated"],
        )
        for p in pages
    ]


def adoptions(f: Fleet) -> list[int]:
    return [i.server.app[CONTEXT].lists.adoptions for i in f.instances]


def round_robin(start: int) -> Callable[[int], int]:
    return lambda page: (start + page) % 3


def only(instance: int) -> Callable[[int], int]:
    return lambda page: instance


def no_rate_limit(servers: Settings) -> Settings:
    return servers.replace(api_rate_limit_per_s=0, api_fill_from_state="never")


async def test_walks_alternating_three_instances_equal_a_single_instances_walk(
    servers: Settings, store_url: str, unique_name: Callable[..., str]
) -> None:
    users = [5000 + n for n in range(40)]
    async with fleet(no_rate_limit(servers), unique_name("walk"), 3, url=store_url) as f:
        rows = {u: mixed_rows(u, 8 + 3 * n, seed=n) for n, u in enumerate(users)}
        await f.store.write([flush(u, rows[u], 4, 2) for u in users])
        pages_walked = 0
        for limit in (3, 7):
            for n, user in enumerate(users):
                for folder in Folder:
                    single = await f.walk(user, limit, folder.value, route=only(0))
                    # Round robin, starting elsewhere than the single walk did (each user differently).
                    spread = await f.walk(user, limit, folder.value, route=round_robin(n + 1))
                    assert summary(spread) == summary(single), (user, limit, folder)
                    assert ids(spread) == expected_order(rows[user], folder), (user, limit, folder)
                    assert all(p["projection_complete"] for p in spread)  # not one restart
                    pages_walked += len(spread)
        # Instances 1 and 2 served cursors of snapshots instance 0 built (it walked each user first).
        assert adoptions(f)[0] == 0 and adoptions(f)[1] >= 40 and adoptions(f)[2] >= 40, adoptions(f)
        assert pages_walked > 400


async def test_a_5000_conversation_walk_alternating_instances_equals_the_single_walk(
    servers: Settings, store_url: str, unique_name: Callable[..., str]
) -> None:
    me = 4747
    rows = mixed_rows(me, 5000, seed=91)
    async with fleet(no_rate_limit(servers), unique_name("walk5k"), 3, url=store_url) as f:
        for start in range(0, 5000, 1000):  # five flushes, as a worker writes them
            await f.store.write([flush(me, rows[start : start + 1000], start // 1000 + 1, 3)])
        for limit in (50, 7):
            for folder in Folder:
                spread = await f.walk(me, limit, folder.value, route=round_robin(1))
                single = await f.walk(me, limit, folder.value, route=only(2))
                assert summary(spread) == summary(single), (limit, folder)
                assert ids(spread) == expected_order(rows, folder)
                assert {p["snapshot_revision"] for p in spread} == {1}
                assert all(p["projection_complete"] for p in spread)


async def test_a_new_message_mid_walk_keeps_the_revision_on_every_instance_and_a_pin_restarts_once(
    servers: Settings, store_url: str, unique_name: Callable[..., str]
) -> None:
    me = 4848
    rows = [make_row(me, n, act=n) for n in range(1, 61)]
    async with fleet(no_rate_limit(servers), unique_name("mid"), 3, url=store_url) as f:
        await f.store.write([flush(me, rows, 1, 1)])
        pages: list[dict[str, Any]] = []
        status, page = await f.get(0, "/v1/sessions", me, limit=10)
        pages.append(page)
        # A message in a conversation further down: it would jump to the top (not structural).
        bumped = make_row(me, 5, act=99, version=2)
        await f.store.write([flush(me, [bumped], 2, 1)])
        for k in range(1, 6):
            status, page = await f.get(k % 3, "/v1/sessions", me, limit=10, cursor=pages[-1]["next_cursor"])
            assert status == 200
            pages.append(page)
        assert [p["snapshot_revision"] for p in pages] == [1] * 6 and all(
            p["projection_complete"] for p in pages
        )
        assert ids(pages) == [cid(n) for n in range(60, 0, -1)]  # the frozen order: no duplicate, no gap
        served = next(r for p in pages for r in p["items"] if r["conversation_id"] == cid(5))
        assert served["last_activity_id"] in (rows[4]["last_activity_id"], bumped["last_activity_id"])
        # A pin (structural) ends the revision on whichever instance sees the next cursor.
        first = (await f.get(1, "/v1/sessions", me, limit=10))[1]
        assert first["snapshot_revision"] == 2  # a new walk: the store moved (version 2)
        pinned = make_row(me, 30, act=30, version=3, pin_rank=0)
        await f.store.write([flush(me, [pinned], 3, 2)])
        status, restarted = await f.get(2, "/v1/sessions", me, limit=10, cursor=first["next_cursor"])
        assert restarted["projection_complete"] is False and restarted["snapshot_revision"] == 3
        assert restarted["items"][0]["conversation_id"] == cid(30)
        walk = [restarted]
        while walk[-1]["next_cursor"]:
            k = len(walk)
            walk.append((await f.get(k % 3, "/v1/sessions", me, limit=10, cursor=walk[-1]["next_cursor"]))[1])
        assert {p["snapshot_revision"] for p in walk} == {3} and all(
            p["projection_complete"] for p in walk[1:]
        )
        assert len(ids(walk)) == 60 == len(set(ids(walk)))


async def test_a_console_reconcile_is_served_by_every_instance_at_once(
    servers: Settings, unique_name: Callable[..., str]
) -> None:
    """The issue's case: five users' stored rows drifted (+7 unread), an instance served them,
    the console's "reconcile this user" corrected them in the store (Correction: the rows and
    badge at the stored version, the version left alone). Every instance's next walk serves
    the corrected rows (it used to serve the drifted ones until the snapshot TTL)."""
    users = [6100 + n for n in range(5)]
    good = {u: [make_row(u, n, act=n) for n in range(1, 13)] for u in users}
    drifted = {u: [{**r, "unread_count": r["unread_count"] + 7} for r in good[u]] for u in users}
    async with fleet(no_rate_limit(servers), unique_name("reconcile"), 3) as f:
        await f.store.write([flush(u, drifted[u], 9, 1) for u in users])
        for i in range(3):  # every instance holds the drifted snapshot
            for u in users:
                walk = await f.walk(u, 5, route=only(i))
                served = {r["conversation_id"]: r["unread_count"] for p in walk for r in p["items"]}
                assert served == {str(r["conversation_id"]): r["unread_count"] for r in drifted[u]}
        # The console's write (app/api/ops/inspector.py): rows and badge at the stored version.
        written = await f.store.correct([Correction(u, 9, good[u], Badge(), "ops-reconcile") for u in users])
        assert written == [True] * 5
        mismatches = 0
        for i in range(3):
            for u in users:
                walk = await f.walk(u, 5, route=only(i))
                served = {r["conversation_id"]: r["unread_count"] for p in walk for r in p["items"]}
                mismatches += sum(served[str(r["conversation_id"])] != r["unread_count"] for r in good[u])
                assert all(p["projection_complete"] for p in walk)
        assert mismatches == 0


async def test_a_row_lost_from_the_store_restarts_the_walk_once_on_a_new_revision(
    servers: Settings, unique_name: Callable[..., str]
) -> None:
    """A row of the frozen order gone from the store without a new version (a key lost, a field
    deleted by hand): an instance that did not build the snapshot cannot place it, so it
    restarts the walk rather than leave a gap, on a new revision built from the store as it is
    (not the same snapshot again, which would restart the walk again and again)."""
    me = 4949
    rows = [make_row(me, n, act=n) for n in range(1, 21)]
    async with fleet(no_rate_limit(servers), unique_name("lost"), 2) as f:
        await f.store.write([flush(me, rows, 1, 1)])
        status, first = await f.get(0, "/v1/sessions", me, limit=5)
        await f.store.client.hdel(f.store.rows_key(me), cid(13))  # in the second page (16..12)
        status, second = await f.get(1, "/v1/sessions", me, limit=5, cursor=first["next_cursor"])
        assert status == 200 and second["projection_complete"] is False and second["snapshot_revision"] == 2
        walk = [second]
        while walk[-1]["next_cursor"]:
            k = len(walk)
            walk.append((await f.get(k % 2, "/v1/sessions", me, limit=5, cursor=walk[-1]["next_cursor"]))[1])
        assert ids(walk) == [cid(n) for n in range(20, 0, -1) if n != 13]
        assert {p["snapshot_revision"] for p in walk} == {2} and all(
            p["projection_complete"] for p in walk[1:]
        )
        # The instance that built revision 1 still serves its frozen rows to its own cursor.
        status, held = await f.get(0, "/v1/sessions", me, limit=5, cursor=first["next_cursor"])
        assert held["snapshot_revision"] == 1 and cid(13) in [r["conversation_id"] for r in held["items"]]
