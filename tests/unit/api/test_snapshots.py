"""The snapshot layer on its own: revisions, TTL, LRU by rows, revisions held per user, one load
for concurrent cold requests."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

import app.api.snapshots as snapshots
from app.api.fleet import MemoryFleetState
from app.api.snapshots import Page, SessionLists, Snapshot, SnapshotCache
from app.api.sources import LoadedRows, MemoryProjectionReader, StoreMeta
from app.domain.listing import Folder, Ordered
from app.stores.memory_projection import InMemoryProjectionStore
from tests.support.rows import flush, make_row


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


_REVISIONS: dict[int, int] = {}


def snap(cache: SnapshotCache, user_id: int, rows: int) -> Snapshot:
    folder = snapshots.FolderSnapshot([], [b"{}"] * rows)
    empty = snapshots.FolderSnapshot([], [])
    revision = _REVISIONS[user_id] = _REVISIONS.get(user_id, 0) + 1
    return Snapshot(
        user_id,
        revision,
        cache.clock_ms(),
        1,
        1,
        {Folder.MAIN: folder, Folder.ARCHIVED: empty},
        snapshot_id=revision * 1000 + user_id,
    )


async def test_revisions_start_at_1_and_only_increase_per_user_across_the_fleet() -> None:
    """The counter is the user's in the store: two processes (two caches) over one store count
    one sequence (issue 32), and every snapshot has an id of its own."""
    store = InMemoryProjectionStore()
    await store.write([flush(1, [make_row(1, n, act=n) for n in range(1, 5)], 1, 1)])
    await store.write([flush(2, [make_row(2, n, act=n) for n in range(1, 5)], 1, 1)])
    a, b = (
        SessionLists(MemoryProjectionReader(store), SnapshotCache(100, 1000, Clock()), max_rows=50)
        for _ in "ab"
    )
    built = [await lists._build(1) for lists in (a, b, a)]
    assert [s.revision for s in built] == [1, 2, 3]
    assert len({s.snapshot_id for s in built}) == 3 and all(s.snapshot_id > 0 for s in built)
    assert (await b._build(2)).revision == 1


def test_ttl_drops_snapshots_and_their_rows() -> None:
    clock = Clock()
    cache = SnapshotCache(100, 1000, clock)
    cache.put(snap(cache, 1, 10))
    clock.now += 999
    assert len(cache.held(1)) == 1 and cache.held_rows == 10
    clock.now += 1
    assert cache.held(1) == [] and cache.held_rows == 0


def test_lru_bound_counts_rows_and_keeps_the_newest_user() -> None:
    cache = SnapshotCache(100, 10_000, Clock())
    cache.put(snap(cache, 1, 40))
    cache.put(snap(cache, 2, 40))
    cache.held(1)  # user 1 is now the most recently used
    cache.put(snap(cache, 3, 40))  # 120 > 100: the least recently used (user 2) goes
    assert cache.held(2) == [] and cache.held(1) and cache.held(3)
    assert cache.held_rows == 80 and cache.evictions == 1


def test_two_revisions_per_user_are_held() -> None:
    cache = SnapshotCache(1000, 10_000, Clock())
    made = [snap(cache, 1, 10) for _ in range(3)]
    for s in made:
        cache.put(s)
    assert cache.held(1) == made[1:] and cache.held_rows == 20


async def test_concurrent_cold_requests_share_one_load() -> None:
    store = InMemoryProjectionStore()
    await store.write([flush(5, [make_row(5, n, act=n) for n in range(1, 50)], 1, 1)])

    class Slow(MemoryProjectionReader):
        async def load_rows(self, user_id: int) -> LoadedRows:
            await asyncio.sleep(0.05)
            return await super().load_rows(user_id)

    lists = SessionLists(Slow(store), SnapshotCache(1000, 10_000, Clock()), max_rows=5000)
    pages = await asyncio.gather(*(lists.page(5, Folder.MAIN, 10, None) for _ in range(5)))
    assert lists.loads == 1 and {p.snapshot.revision for p in pages} == {1}


async def test_a_failed_load_fails_its_waiters_and_the_next_request_retries() -> None:
    calls = 0

    class Flaky:
        fleet = MemoryFleetState()

        async def meta(self, user_id: int) -> StoreMeta:
            return StoreMeta(0, 0, 0, 0, 0)

        async def some_rows(
            self, user_id: int, conversation_ids: list[str]
        ) -> tuple[list[bytes | None], StoreMeta]:
            return [None] * len(conversation_ids), StoreMeta(0, 0, 0, 0, 0)

        async def load_rows(self, user_id: int) -> LoadedRows:
            nonlocal calls
            calls += 1
            await asyncio.sleep(0.01)
            if calls == 1:
                raise RuntimeError("boom")
            return LoadedRows(StoreMeta(0, 0, 0, 0, 0), [])

    lists = SessionLists(Flaky(), SnapshotCache(1000, 10_000, Clock()), max_rows=5000)
    results = await asyncio.gather(
        *(lists.page(5, Folder.MAIN, 10, None) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)
    page = await lists.page(5, Folder.MAIN, 10, None)
    assert page.snapshot.revision == 1 and calls == 2


def test_ordered_after_is_a_keyset_bound() -> None:
    assert Ordered([], []).after(None) == 0


async def test_a_cancelled_request_does_not_cancel_the_shared_load() -> None:
    store = InMemoryProjectionStore()
    await store.write([flush(5, [make_row(5, n, act=n) for n in range(1, 5)], 1, 1)])

    started, release = asyncio.Event(), asyncio.Event()

    class Held(MemoryProjectionReader):
        """The load waits for the test's go-ahead (no real-time guesses about who runs first)."""

        async def load_rows(self, user_id: int) -> LoadedRows:
            started.set()
            await release.wait()
            return await super().load_rows(user_id)

    lists = SessionLists(Held(store), SnapshotCache(1000, 10_000, Clock()), max_rows=5000)
    first = asyncio.create_task(lists.page(5, Folder.MAIN, 10, None))
    await started.wait()  # the shared load is under way for `first`
    second = asyncio.create_task(lists.page(5, Folder.MAIN, 10, None))
    for _ in range(10):
        await asyncio.sleep(0)  # let `second` reach the shared load and wait on it
    first.cancel()  # its client went away, while the load is still held
    await asyncio.sleep(0)
    release.set()
    page = await second
    assert len(page.items) == 4 and lists.loads == 1
    assert first.cancelled()


def test_held_rows_are_exact_size_copies() -> None:
    import tracemalloc

    import orjson

    from app.api.snapshots import held_json

    rows = [make_row(5, n, act=n) for n in range(200)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = [held_json(row) for row in rows]
        per_row = (tracemalloc.get_traced_memory()[0] - before) / len(rows)
    finally:
        tracemalloc.stop()
    assert held[7] == orjson.dumps(rows[7])
    assert per_row < 2 * len(held[7]) + 200, per_row  # not orjson's ~8 KB write buffer per row


_CHANGES = st.lists(
    st.tuples(
        st.integers(1, 30),
        st.sampled_from(
            ["message", "read", "pin", "unpin", "archive", "unarchive", "delete", "revive", "new"]
        ),
        st.integers(0, 3),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(
    first=st.lists(st.tuples(st.integers(0, 5), st.booleans(), st.booleans()), min_size=30, max_size=30),
    changes=_CHANGES,
    max_rows=st.sampled_from([5000, 25, 10]),
    served=st.integers(1, 30),
)
def test_a_reload_serves_what_a_build_from_scratch_serves(
    first: list[tuple[int, bool, bool]], changes: list[tuple[int, str, int]], max_rows: int, served: int
) -> None:
    """A reload after some rows changed places the unchanged ones as the snapshot it holds put
    them (the same bytes objects: one copy for both revisions) and serves, page for page, the
    bytes a build from scratch serves (J-5: the order of a fresh walk)."""

    async def run() -> None:
        user = 7
        rows = {
            n: make_row(user, n, act=n * 7 % 40 or None, pin_rank=pin or None, archived=arch, listed=listed)
            for n, (pin, arch, listed) in enumerate(first, start=1)
        }
        store = InMemoryProjectionStore()
        await store.write([flush(user, list(rows.values()), 1, 1)])
        held = SessionLists(
            MemoryProjectionReader(store), SnapshotCache(10_000, 10_000, Clock()), max_rows=max_rows
        )
        earlier = (await held.page(user, Folder.MAIN, served, None)).snapshot
        for n, kind, value in changes:
            row = dict(rows.get(n) or make_row(user, n + 100, act=value + 50))
            if kind in ("message", "revive", "new"):
                row.update(last_activity_id=f"{value + 1_000:032x}", listed=True)
            elif kind == "read":
                row["unread_count"] = value
            elif kind in ("pin", "unpin"):
                row["pin_rank"] = value if kind == "pin" else None
            elif kind in ("archive", "unarchive"):
                row["archived"] = kind == "archive"
            else:
                row["listed"] = False
            rows[n if kind != "new" else n + 100] = row
        await store.write([flush(user, list(rows.values()), 2, 2)])

        reloaded = (await held.page(user, Folder.MAIN, served, None)).snapshot
        scratch_lists = SessionLists(
            MemoryProjectionReader(store), SnapshotCache(10_000, 10_000, Clock()), max_rows=max_rows
        )
        scratch = await scratch_lists._build(user)  # nothing held there: every row parsed and sorted
        assert scratch_lists.adoptions == 0 and scratch.snapshot_id != reloaded.snapshot_id
        assert reloaded.revision == earlier.revision + 1 and reloaded.version == scratch.version == 2
        assert reloaded.dropped == scratch.dropped
        for folder in Folder:
            again, fresh = reloaded.folders[folder], scratch.folders[folder]
            assert again.keys == fresh.keys
            assert (
                Page(reloaded, folder, 0, len(again), True).items
                == Page(scratch, folder, 0, len(fresh), True).items
            )
            before = [b for listing in earlier.folders.values() for b in listing.stored if b is not None]
            same_objects = {id(b) for b in before}
            unchanged = set(before)
            assert all(id(b) in same_objects for b in again.stored if b in unchanged)

    asyncio.run(run())
