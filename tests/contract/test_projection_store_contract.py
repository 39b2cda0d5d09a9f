"""The `ProjectionStore` contract (docs/contract.md §3.9): one suite, run against the in-memory store and
the Redis store on the real server.

What every implementation must do: per user, one atomic write of rows + badge + version +
structure version, refused when the stored version is not older (so a replay after a crash is
idempotent and rows and badge never tear); many users per call; u64 ids; write counts on demand.
The Redis-only tests at the end cover what only Redis can get wrong (scripts lost by the server,
pipelining, errors at the boundary, key layout).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster

from app.domain.badge import Badge
from app.domain.flush import Correction, UserFlush
from app.domain.projection_store import ProjectionStore, StoredProjection, StoredRows
from app.settings import Settings
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.redis_projection import ProjectionStoreError, RedisProjectionStore
from tests.contract.conftest import MakeRedisStore, MakeStore, ProjectionStoreUnderTest
from tests.support.store_rows import DEFAULT_BADGE, conv, flush, row

pytestmark = pytest.mark.timeout(120)

U64_MAX = (1 << 64) - 1


def expected(batches: list[UserFlush]) -> dict[int, StoredProjection]:
    """What the store must hold after writing `batches` (each newer than the last per user)."""
    out: dict[int, StoredProjection] = {}
    for b in batches:
        before = out.get(b.user_id)
        rows = dict(before.rows) if before else {}
        rows.update({r["conversation_id"]: r for r in b.rows})
        badge = b.badge
        out[b.user_id] = StoredProjection(
            b.user_id,
            rows,
            badge.total_unread,
            badge.total_mention,
            badge.muted_unread,
            b.projection_mailbox_seq,
            b.structure_version,
            archived_unread=badge.archived_unread,
            archived_mention=badge.archived_mention,
            badge_mode=badge.badge_mode,
            include_muted=badge.include_muted,
        )
    return out


async def assert_holds(store: ProjectionStoreUnderTest, want: dict[int, StoredProjection]) -> None:
    for user_id, projection in want.items():
        got = await store.load(user_id)
        assert got.rows.keys() == projection.rows.keys(), user_id
        for cid, want_row in projection.rows.items():
            for field, value in want_row.items():  # field by field: a mismatch names the field
                assert got.rows[cid][field] == value, (user_id, cid, field)
            assert got.rows[cid] == want_row
        assert got == projection


def test_both_stores_satisfy_the_port() -> None:
    # Structural check for mypy (`mypy tests/contract`): both classes are ProjectionStores.
    stores: list[ProjectionStore] = [InMemoryProjectionStore(), RedisProjectionStore(redis.Redis())]
    assert stores


# -- the contract ----------------------------------------------------------------------------------


async def test_write_then_load_round_trips_rows_badge_version_and_structure_version(
    store: ProjectionStoreUnderTest,
) -> None:
    batches = [
        flush(7, 12, [conv(1), conv(2), conv(3)], Badge(9, 2, 4), structure_version=3),
        flush(8, 5, [conv(1)], Badge(0, 0, 0), pin_rank=4, pinned=True, muted=True, listed=False),
    ]
    assert await store.write(batches) == [0, 0]  # nothing was stored before
    await assert_holds(store, expected(batches))
    got = await store.load(7)
    assert (got.total_unread, got.total_mention, got.muted_unread) == (9, 2, 4)
    assert (got.projection_mailbox_seq, got.structure_version) == (12, 3)
    assert (await store.load(8)).rows[conv(1)]["listed"] is False  # stored whatever `listed` says


async def test_load_of_an_unknown_user_is_empty_at_version_zero(store: ProjectionStoreUnderTest) -> None:
    assert await store.load(123) == StoredProjection(123, {}, 0, 0, 0, 0, 0)
    assert await store.versions([123]) == [0]


async def test_equal_and_older_versions_are_refused_and_change_nothing(
    store: ProjectionStoreUnderTest,
) -> None:
    first = flush(7, 10, [conv(1), conv(2)], Badge(5, 1, 0), structure_version=2)
    assert await store.write([first]) == [0]
    before = await store.load(7)
    # Same version, other content (a different flush must never share a version, but if one
    # did, the stored one wins whole); then an older one, touching a new conversation too.
    same = flush(7, 10, [conv(1)], Badge(0, 0, 0), structure_version=9, unread_count=0)
    older = flush(7, 9, [conv(1), conv(3)], Badge(1, 1, 1), structure_version=1, unread_count=99)
    assert await store.write([same]) == [None]
    assert await store.write([older]) == [None]
    assert await store.load(7) == before  # rows, badge and versions: not one field moved
    assert await store.versions([7]) == [10]


async def test_a_newer_batch_overwrites_only_the_rows_it_carries(store: ProjectionStoreUnderTest) -> None:
    v1 = flush(7, 4, [conv(1), conv(2), conv(3)], Badge(9, 3, 0))
    v2 = flush(7, 8, [conv(2)], Badge(7, 3, 0), structure_version=1, unread_count=1, archived=True)
    assert await store.write([v1]) == [0]
    assert await store.write([v2]) == [4]  # the version stored before it
    await assert_holds(store, expected([v1, v2]))
    got = await store.load(7)
    assert got.rows[conv(1)]["projection_mailbox_seq"] == 4  # untouched rows keep their version
    assert got.rows[conv(2)]["projection_mailbox_seq"] == 8
    assert got.rows[conv(2)]["archived"] is True
    assert (got.total_unread, got.structure_version, got.projection_mailbox_seq) == (7, 1, 8)


async def test_a_batch_without_rows_still_moves_badge_and_version(store: ProjectionStoreUnderTest) -> None:
    assert await store.write([flush(7, 4, [conv(1)], Badge(2, 0, 0))]) == [0]
    assert await store.write([flush(7, 6, [], Badge(0, 0, 0))]) == [4]
    got = await store.load(7)
    assert (got.projection_mailbox_seq, got.total_unread, list(got.rows)) == (6, 0, [conv(1)])


async def test_an_empty_call_writes_nothing(store: ProjectionStoreUnderTest) -> None:
    assert await store.write([]) == []
    assert await store.user_ids() == []


async def test_versions_per_user_in_the_order_asked(store: ProjectionStoreUnderTest) -> None:
    await store.write([flush(1, 5, [conv(1)]), flush(2, 9, [conv(1)]), flush(3, 1, [conv(1)])])
    assert await store.versions([3, 404, 1, 2, 1]) == [1, 0, 5, 9, 5]
    assert await store.versions([]) == []


async def test_the_same_user_twice_in_one_call_is_applied_in_call_order(
    store: ProjectionStoreUnderTest,
) -> None:
    assert await store.write([flush(7, 5, [conv(1)]), flush(7, 7, [conv(2)])]) == [0, 5]
    assert await store.write([flush(7, 9, [conv(1)]), flush(7, 8, [conv(3)])]) == [7, None]
    got = await store.load(7)
    assert sorted(got.rows) == [conv(1), conv(2)]
    assert got.projection_mailbox_seq == 9


async def test_many_users_in_one_call_are_all_written(store: ProjectionStoreUnderTest) -> None:
    users = range(1_000, 3_000)  # 2,000 users x 3 rows: several pipelined trips on Redis
    batches = [
        flush(u, u + 1, [conv(u), conv(u + 1), conv(u + 2)], Badge(u % 7, u % 3, u % 2)) for u in users
    ]
    assert await store.write(batches) == [0] * len(batches)
    assert await store.versions(list(users)) == [u + 1 for u in users]
    assert await store.user_ids() == list(users)
    want = expected(batches)
    await assert_holds(store, {u: want[u] for u in (1_000, 1_999, 2_500, 2_999)})


async def test_a_heavy_user_with_5000_rows_is_one_atomic_write(store: ProjectionStoreUnderTest) -> None:
    # 5,000 conversations = 10,000 script arguments: more than Lua can unpack() at once.
    batch = flush(7, 3, [conv(n) for n in range(5_000)], Badge(5_000, 0, 0))
    assert await store.write([batch]) == [0]
    got = await store.load(7)
    assert len(got.rows) == 5_000
    assert got.rows[conv(4_999)] == batch.rows[-1]


async def test_replaying_batches_after_a_crash_is_idempotent(store: ProjectionStoreUnderTest) -> None:
    # Three flushes of three users; the worker crashes after writing the first two and, restarted
    # from an earlier checkpoint, re-sends all three.
    rounds = [
        [flush(u, 10 * r + u, [conv(r), conv(u)], Badge(r, u, 0), structure_version=r) for u in (1, 2, 3)]
        for r in (1, 2, 3)
    ]
    for batches in rounds[:2]:
        assert all(v is not None for v in await store.write(batches))
    after_two = {u: await store.load(u) for u in (1, 2, 3)}
    # Re-delivery: the already written rounds are refused and change nothing ...
    for batches in rounds[:2]:
        assert await store.write(batches) == [None, None, None]
    assert {u: await store.load(u) for u in (1, 2, 3)} == after_two
    # ... the round the crash lost is written, and then it too is refused on replay.
    assert await store.write(rounds[2]) == [21, 22, 23]
    assert await store.write(rounds[2]) == [None, None, None]
    await assert_holds(store, expected([b for batches in rounds for b in batches]))


async def test_rows_and_badge_never_tear_under_concurrent_reads(store: ProjectionStoreUnderTest) -> None:
    # Every batch rewrites all rows with its version and sets the badge to it: any load that
    # mixes two flushes shows rows (or a badge) at a version other than the stored one.
    conversations = [conv(n) for n in range(200)]
    done = asyncio.Event()
    seen: list[StoredProjection] = []

    async def writer() -> None:
        for version in range(1, 41):
            await store.write([flush(7, version, conversations, Badge(version, version, 0))])
        done.set()

    async def reader() -> None:
        while not done.is_set():
            seen.append(await store.load(7))
            await asyncio.sleep(0)

    await asyncio.gather(writer(), reader(), reader())
    seen.append(await store.load(7))
    for snapshot in seen:
        version = snapshot.projection_mailbox_seq
        if version == 0:
            assert snapshot.rows == {}
            continue
        assert snapshot.total_unread == snapshot.total_mention == version
        assert {r["projection_mailbox_seq"] for r in snapshot.rows.values()} == {version}
        assert len(snapshot.rows) == len(conversations)
    assert seen[-1].projection_mailbox_seq == 40


async def test_write_counts_count_persistent_writes_per_conversation(make_store: MakeStore) -> None:
    counting = make_store(count_writes=True)
    await counting.write([flush(7, 1, [conv(1), conv(2)])])
    await counting.write([flush(7, 2, [conv(1)])])
    await counting.write([flush(7, 2, [conv(1), conv(3)])])  # refused: counts nothing
    await counting.write([flush(7, 3, [conv(1)]), flush(8, 3, [conv(1)])])
    assert await counting.write_counts(7) == {conv(1): 3, conv(2): 1}
    assert await counting.write_counts(8) == {conv(1): 1}
    assert await counting.write_counts(9) == {}
    plain = make_store()
    await plain.write([flush(7, 1, [conv(1)])])
    assert await plain.write_counts(7) == {}  # off unless asked for


async def test_u64_user_ids_and_versions_beyond_2_pow_53(store: ProjectionStoreUnderTest) -> None:
    big = [U64_MAX, U64_MAX - 1, 0]
    assert await store.write([flush(u, 1 << 53, [conv(1)]) for u in big]) == [0, 0, 0]
    # 2^53 + 1 is not a double: a store comparing versions as Lua numbers would see it equal to
    # 2^53 and refuse it.
    assert await store.write([flush(U64_MAX, (1 << 53) + 1, [conv(2)])]) == [1 << 53]
    assert await store.write([flush(U64_MAX, 1 << 53, [conv(3)])]) == [None]
    assert await store.write([flush(U64_MAX - 1, U64_MAX, [conv(2)])]) == [1 << 53]
    assert await store.write([flush(U64_MAX - 1, U64_MAX - 1, [conv(3)])]) == [None]
    assert await store.versions(big) == [(1 << 53) + 1, U64_MAX, 1 << 53]
    assert await store.user_ids() == sorted(big)
    got = await store.load(U64_MAX)
    assert got.rows[conv(2)]["user_id"] == U64_MAX
    assert sorted(got.rows) == [conv(1), conv(2)]


async def test_delete_all_empties_the_store(make_store: MakeStore) -> None:
    store = make_store(count_writes=True)
    await store.write([flush(u, 2, [conv(1), conv(2)]) for u in (1, 2, 3)])
    assert await store.delete_all() == 3
    assert await store.user_ids() == []
    assert await store.versions([1, 2, 3]) == [0, 0, 0]
    assert await store.load(1) == StoredProjection(1, {}, 0, 0, 0, 0, 0)
    assert await store.write_counts(1) == {}
    # After a delete, a rebuild writes from scratch: the first batch is accepted again.
    assert await store.write([flush(1, 2, [conv(1)])]) == [0]
    assert await store.delete_all() == 1


@pytest.mark.parametrize(
    "bad",
    [
        flush(-1, 5, [conv(1)]),
        flush(1 << 64, 5, [conv(1)]),
        flush(7, 0, [conv(1)]),
        flush(7, 5, [conv(1)], structure_version=-1),
        UserFlush(7, [{"unread_count": 1}], Badge(), 5, 0, 0, "ev", 5),
    ],
    ids=["negative-user", "user-beyond-u64", "version-0", "negative-structure", "row-without-id"],
)
async def test_a_malformed_batch_fails_the_call_before_anything_is_written(
    store: ProjectionStoreUnderTest, bad: UserFlush
) -> None:
    with pytest.raises(ValueError):
        await store.write([flush(1, 5, [conv(1)]), bad])
    assert await store.versions([1]) == [0]
    assert await store.user_ids() == []


# -- the unread audit's reads and corrections (issue 7) ----------------------------------------------


async def test_load_rows_reads_the_asked_rows_with_the_meta(store: ProjectionStoreUnderTest) -> None:
    batch = flush(7, 12, [conv(1), conv(2), conv(3)], Badge(9, 2, 4), structure_version=3)
    await store.write([batch])
    got = await store.load_rows(7, [conv(3), conv(1), conv(9)])
    assert got == StoredRows(
        user_id=7,
        rows={conv(3): batch.rows[2], conv(1): batch.rows[0], conv(9): None},  # None: not stored
        total_unread=9,
        total_mention=2,
        muted_unread=4,
        projection_mailbox_seq=12,
    )
    assert await store.load_rows(404, [conv(1)]) == StoredRows(404, {conv(1): None}, 0, 0, 0, 0)
    assert (await store.load_rows(7, [])).rows == {}


async def test_a_correction_rewrites_rows_and_badge_at_the_stored_version_only(
    store: ProjectionStoreUnderTest,
) -> None:
    await store.write([flush(7, 10, [conv(1), conv(2)], Badge(6, 2, 0), structure_version=2)])
    fixed = row(7, conv(1), 10, unread_count=1)
    assert await store.correct([Correction(7, 10, [fixed], Badge(4, 2, 0))]) == [True]
    got = await store.load(7)
    assert got.rows[conv(1)] == fixed
    assert got.rows[conv(2)] == row(7, conv(2), 10)  # rows it does not carry are untouched
    assert (got.total_unread, got.total_mention, got.muted_unread) == (4, 2, 0)
    # The version and the structure version stay: a correction restates V, it never moves it.
    assert (got.projection_mailbox_seq, got.structure_version) == (10, 2)
    # So the flush path still refuses V and accepts anything newer.
    assert await store.write([flush(7, 10, [conv(1)], unread_count=50)]) == [None]
    assert await store.write([flush(7, 11, [conv(2)], Badge(5, 2, 0))]) == [10]


async def test_a_correction_against_another_version_changes_nothing(store: ProjectionStoreUnderTest) -> None:
    await store.write([flush(7, 10, [conv(1)], Badge(6, 2, 0))])
    before = await store.load(7)
    stale = Correction(7, 9, [row(7, conv(1), 9, unread_count=0)], Badge(0, 0, 0))  # compared at 9
    ahead = Correction(7, 11, [row(7, conv(1), 11, unread_count=0)], Badge(0, 0, 0))
    nobody = Correction(8, 3, [row(8, conv(1), 3)], Badge(0, 0, 0))  # never stored: not created
    assert await store.correct([stale, ahead, nobody]) == [False, False, False]
    assert await store.load(7) == before
    assert await store.user_ids() == [7]


async def test_a_badge_only_correction_and_many_users_in_one_call(store: ProjectionStoreUnderTest) -> None:
    await store.write([flush(u, 5, [conv(1)], Badge(3, 0, 0)) for u in range(1, 301)])
    fixes = [Correction(u, 5, [], Badge(u, 0, 0)) for u in range(1, 301)]
    assert await store.correct(fixes) == [True] * 300
    assert [(await store.load(u)).total_unread for u in (1, 150, 300)] == [1, 150, 300]
    assert await store.correct([]) == []


async def test_a_malformed_correction_fails_the_call_before_anything_is_written(
    store: ProjectionStoreUnderTest,
) -> None:
    await store.write([flush(7, 5, [conv(1)], Badge(3, 0, 0))])
    before = await store.load(7)
    good = Correction(7, 5, [row(7, conv(1), 5, unread_count=0)], Badge(0, 0, 0))
    for bad in (
        Correction(7, 0, [], Badge(0, 0, 0)),  # version 0 is "nothing stored"
        Correction(-1, 5, [], Badge(0, 0, 0)),
        Correction(7, 5, [{"unread_count": 1}], Badge(0, 0, 0)),  # a row without its id
    ):
        with pytest.raises(ValueError):
            await store.correct([good, bad])
    assert await store.load(7) == before


# -- Redis only ------------------------------------------------------------------------------------

redis_only = pytest.mark.integration


@pytest.fixture
def redis_store(make_redis_store: MakeRedisStore) -> RedisProjectionStore:
    return make_redis_store()


@redis_only
async def test_redis_layout_uses_namespaced_hash_tagged_keys(
    redis_client: redis.Redis, make_redis_store: MakeRedisStore
) -> None:
    store = make_redis_store(count_writes=True)
    await store.write(
        [flush(42, 3, [conv(1)], Badge(1, 2, 3, 5, 6, "conversations", True), structure_version=4)]
    )
    ns = store.namespace
    # A set: SCAN may return a key more than once (while Redis resizes its table).
    keys = sorted({k.decode() async for k in redis_client.scan_iter(match=f"{ns}:*")})
    # {42} is a hash tag: one cluster slot per user, so the per-user script may touch all three.
    assert keys == [f"{ns}:meta:{{42}}", f"{ns}:rows:{{42}}", f"{ns}:writes:{{42}}"]
    assert await redis_client.hgetall(f"{ns}:meta:{{42}}") == {
        b"version": b"3",
        b"structure_version": b"4",
        b"total_unread": b"1",
        b"total_mention": b"2",
        b"muted_unread": b"3",
        # docs/contract.md §10 (projection_codec.badge_extra)
        b"archived_unread": b"5",
        b"archived_mention": b"6",
        b"conversations_mode": b"1",
        b"include_muted": b"1",
    }
    got = await store.load(42)
    assert (got.archived_unread, got.archived_mention, got.badge_mode, got.include_muted) == (
        5,
        6,
        "conversations",
        True,
    )


def forget_digests(script: Any) -> None:
    """As after a restart or SCRIPT FLUSH: digests the server does not know (the script's and
    its batched form's)."""
    script.sha = script.batched.sha = "0" * 40


def digests_forgotten(script: Any) -> bool:
    return "0" * 40 in (script.sha, script.batched.sha)


@redis_only
async def test_redis_falls_back_when_the_server_lost_the_script(redis_store: RedisProjectionStore) -> None:
    # As after a restart or SCRIPT FLUSH: the digest the store holds is unknown to the server.
    # (A bogus digest instead of SCRIPT FLUSH, which would disturb other tests on the server.)
    # Both forms: a cluster runs the script per user, a single server its batched form.
    forget_digests(redis_store._write_script)
    assert await redis_store.write([flush(7, 2, [conv(1)]), flush(8, 2, [conv(1)])]) == [0, 0]
    assert await redis_store.versions([7, 8]) == [2, 2]
    assert not digests_forgotten(redis_store._write_script)  # reloaded: the next write goes by digest


@redis_only
async def test_redis_correction_survives_a_server_that_lost_its_script(
    redis_store: RedisProjectionStore,
) -> None:
    await redis_store.write([flush(7, 2, [conv(1)]), flush(8, 2, [conv(1)])])
    forget_digests(redis_store._correct_script)  # as in the write test
    fixes = [Correction(u, 2, [row(u, conv(1), 2, unread_count=0)], Badge()) for u in (7, 8)]
    assert await redis_store.correct(fixes) == [True, True]
    assert [(await redis_store.load(u)).rows[conv(1)]["unread_count"] for u in (7, 8)] == [0, 0]
    assert not digests_forgotten(redis_store._correct_script)  # reloaded


@redis_only
async def test_redis_correction_of_a_wrong_typed_key_is_a_store_error(
    redis_client: redis.Redis, redis_store: RedisProjectionStore
) -> None:
    await redis_store.write([flush(7, 2, [conv(1)])])
    await redis_client.delete(redis_store.rows_key(7))
    await redis_client.set(redis_store.rows_key(7), b"not a hash")
    try:
        with pytest.raises(ProjectionStoreError, match="correcting user 7"):
            await redis_store.correct([Correction(7, 2, [row(7, conv(1), 2)], Badge())])
        assert (await redis_store.load_rows(7, [])).total_unread == DEFAULT_BADGE.total_unread
    finally:
        await redis_client.delete(redis_store.rows_key(7))


@redis_only
async def test_redis_pipelines_many_users_per_round_trip(
    redis_store: RedisProjectionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = 0
    real_pipeline = redis_store.client.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        nonlocal trips
        trips += 1
        return real_pipeline(*args, **kwargs)

    monkeypatch.setattr(redis_store.client, "pipeline", counting_pipeline)
    # One server: each trip is packed once and written with one call (no redis-py pipeline).
    real_packed = redis_store._evalsha_packed

    async def counting_packed(*args: Any) -> Any:
        nonlocal trips
        trips += 1
        return await real_packed(*args)

    monkeypatch.setattr(redis_store, "_evalsha_packed", counting_packed)
    await redis_store.write([flush(u, 1, [conv(1), conv(2), conv(3)]) for u in range(2_000)])
    # 256 users per trip (3 rows + 5 meta fields each stays under the 4,096-field budget); on a
    # cluster a trip is one pipeline per master (sent concurrently), its users' keys all there.
    per_trip = 3 if isinstance(redis_store.client, RedisCluster) else 1
    assert trips == 8 * per_trip


@redis_only
async def test_redis_splits_trips_by_field_budget_without_splitting_a_user(
    make_redis_store: MakeRedisStore,
) -> None:
    store = make_redis_store(max_fields_per_trip=20)
    batches = [flush(1, 1, [conv(n) for n in range(50)]), flush(2, 1, [conv(1)]), flush(3, 1, [conv(1)])]
    assert [len(t) for t in store._trips([*map(_encoded, batches)])] == [1, 2]
    assert await store.write(batches) == [0, 0, 0]


@redis_only
async def test_redis_reads_versions_and_inventory_over_several_trips_in_order(
    make_redis_store: MakeRedisStore,
) -> None:
    # 3 fields a trip: versions read 3 users a trip, the inventory (2 fields each) 1 user a trip.
    store = make_redis_store(max_fields_per_trip=3)
    users = [5, 1, 9, 2, 8, 3, 7]
    written = {1: (4, 2), 2: (6, 1), 3: (2, 3), 7: (9, 1)}  # user -> (version, rows)
    await store.write([flush(u, v, [conv(n) for n in range(rows)]) for u, (v, rows) in written.items()])
    assert await store.versions(users) == [written.get(u, (0, 0))[0] for u in users]
    assert await store.inventory(users) == [written.get(u, (0, 0)) for u in users]


@redis_only
async def test_the_apis_reader_takes_the_badge_preferences_and_folder_totals_from_the_meta(
    make_redis_store: MakeRedisStore,
) -> None:
    from app.api.sources import RedisProjectionReader, StoreMeta

    store = make_redis_store()
    badge = Badge(3, 1, 2, 5, 4, "conversations", True)
    await store.write([flush(7, 6, [conv(1)], badge, structure_version=2)])
    meta = await RedisProjectionReader(store).meta(7)
    assert meta == StoreMeta(
        version=6,
        structure_version=2,
        total_unread=3,
        total_mention=1,
        muted_unread=2,
        archived_unread=5,
        archived_mention=4,
        badge_mode="conversations",
        include_muted=True,
    )


def _encoded(batch: UserFlush) -> Any:
    from app.stores.projection_codec import encode_batches

    return encode_batches([batch])[0]


@redis_only
async def test_redis_errors_become_projection_store_errors(
    redis_client: redis.Redis, redis_store: RedisProjectionStore
) -> None:
    # A wrong-typed rows key: the script fails before writing anything, meta included.
    await redis_client.set(redis_store.rows_key(7), b"not a hash")
    with pytest.raises(ProjectionStoreError, match="writing user 7"):
        await redis_store.write([flush(7, 2, [conv(1)])])
    assert await redis_store.versions([7]) == [0]
    await redis_client.delete(redis_store.rows_key(7))
    # Data no writer of ours produced: reported, not a bare ValueError from deep inside.
    await redis_client.hset(redis_store.rows_key(8), "c", b"{not json")
    with pytest.raises(ProjectionStoreError, match="user 8 has unreadable data"):
        await redis_store.load(8)
    await redis_client.delete(redis_store.rows_key(8))
    # An unreachable server: a clear error, not a redis-py exception from deep inside.
    down = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    try:
        with pytest.raises(ProjectionStoreError, match="unreachable during write"):
            await RedisProjectionStore(down, "x").write([flush(7, 2, [conv(1)])])
    finally:
        await down.aclose()


@redis_only
async def test_redis_a_failing_user_in_a_trip_leaves_the_others_written(
    redis_client: redis.Redis, redis_store: RedisProjectionStore
) -> None:
    # One trip of three users (on a single server one batched script call): the middle one's
    # rows key is wrong-typed. Its error is reported; the users before and after it are written,
    # as each is its own atomic script call, whatever carries the trip.
    await redis_client.set(redis_store.rows_key(8), b"not a hash")
    try:
        with pytest.raises(ProjectionStoreError, match="writing user 8"):
            await redis_store.write([flush(u, 2, [conv(1)]) for u in (7, 8, 9)])
        assert await redis_store.versions([7, 8, 9]) == [2, 0, 2]
    finally:
        await redis_client.delete(redis_store.rows_key(8))
    # The written users' retry answers "already stored"; the failed one is written now.
    assert await redis_store.write([flush(u, 2, [conv(1)]) for u in (7, 8, 9)]) == [None, 0, None]


@redis_only
async def test_redis_delete_all_keeps_other_keys_and_namespaces(
    redis_client: redis.Redis, redis_store: RedisProjectionStore, make_redis_store: MakeRedisStore
) -> None:
    ns = redis_store.namespace
    neighbour = make_redis_store()  # e.g. a rebuild's fresh namespace
    await redis_store.write([flush(1, 1, [conv(1)])])
    await neighbour.write([flush(1, 1, [conv(1)])])
    foreign = f"{ns}:something-else"
    await redis_client.set(foreign, b"1")
    try:
        assert await redis_store.delete_all() == 1
        assert await redis_client.get(foreign) == b"1"
        assert await neighbour.versions([1]) == [1]
    finally:
        await redis_client.delete(foreign)


class _RepeatingScan(redis.Redis):
    """A real client whose SCAN returns every key twice, as Redis may while it resizes its table."""

    async def scan_iter(self, *args: Any, **kwargs: Any) -> Any:
        async for key in super().scan_iter(*args, **kwargs):
            yield key
            yield key


@redis_only
async def test_redis_user_listing_and_delete_count_each_user_once_when_scan_repeats(
    settings: Settings, unique_name: Callable[..., str]
) -> None:
    client = _RepeatingScan.from_url(settings.redis.redis_url)
    store = RedisProjectionStore(client, unique_name("proj"), count_writes=True)
    try:
        await store.write([flush(user, 1, [conv(1), conv(2)]) for user in (3, 1, 2)])
        assert await store.user_ids() == [1, 2, 3]
        assert await store.delete_all() == 3
        assert await store.user_ids() == []
    finally:
        await store.delete_all()
        await client.aclose()


def test_redis_namespace_and_trip_bounds_are_checked() -> None:
    client = redis.Redis()  # never connects: constructors do no I/O
    for bad in ("", "a:b", "proj*", "p{1}", "x" * 65):
        with pytest.raises(ValueError, match="namespace"):
            RedisProjectionStore(client, bad)
    with pytest.raises(ValueError, match="per_trip"):
        RedisProjectionStore(client, max_users_per_trip=0)
    with pytest.raises(ValueError, match="per_trip"):
        RedisProjectionStore(client, max_fields_per_trip=0)


@redis_only
async def test_redis_store_from_settings_owns_and_closes_its_client(
    settings: Settings, unique_name: Callable[..., str]
) -> None:
    store = RedisProjectionStore.from_settings(settings.redis, unique_name("proj"), count_writes=True)
    assert store.max_users_per_trip == settings.redis.flush_batch_size
    try:
        assert await store.write([flush(7, 1, [conv(1)])]) == [0]
        assert await store.write_counts(7) == {conv(1): 1}
    finally:
        await store.delete_all()
        await store.aclose()
