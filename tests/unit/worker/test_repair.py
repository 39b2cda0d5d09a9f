"""The projection repair (issue 18, app/worker/repair.py) with the in-memory store: the store
loses everything (or some users) in the middle of a stream; the worker finds out by itself and
writes the projection again from its state. The end: the store equals replay of the stream,
and devices that follow the frames (and re-pull on a gap, as the client rule says) hold replay's
rows and badges, whether they pulled before, during or after the loss."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.client import Badge, SessionView
from app.replay import ReplayOptions, run_replay
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from app.worker.core import PartitionState, WorkerCore
from app.worker.repair import DONE, RESTORING, ProjectionRepairer, RepairConfig, RepairReport
from tests.support.builders import CONV_A, CONV_B
from tests.support.builders import StreamBuilder as Builder
from tests.support.clock import ManualClock as Clock
from tests.support.projection_files import as_replay_files as final_projection
from tests.support.strategies import Stream, scenarios, streams
from tests.support.worker import (
    RecordingOutbox as Outbox,
)
from tests.support.worker import (
    batches,
    make_core,
    message_store_for,
    records,
)


class Devices:
    """One client per user, following every frame the worker emits (in order), re-pulling the
    list from the store on a gap (docs/contract.md §4)."""

    def __init__(self, outbox: Outbox, store: InMemoryProjectionStore) -> None:
        self.outbox = outbox
        self.store = store
        self.views: dict[int, SessionView] = {}
        self.seen = 0
        self.repulls = 0

    async def pull(self, user_id: int) -> None:
        stored = await self.store.load(user_id)
        view = self.views.setdefault(user_id, SessionView(user_id))
        badge = Badge(
            stored.total_unread, stored.total_mention, stored.muted_unread, stored.projection_mailbox_seq
        )
        view.reset(stored.rows.values(), stored.projection_mailbox_seq, badge=badge)

    async def follow(self) -> None:
        frames = self.outbox.frames_out[self.seen :]
        self.seen = len(self.outbox.frames_out)
        for frame in frames:
            user_id = frame["user_id"]
            if user_id not in self.views:
                await self.pull(user_id)
            if self.views[user_id].apply(frame).needs_repull:
                self.repulls += 1
                await self.pull(user_id)

    def rows(self, user_id: int) -> list[dict[str, Any]]:
        view = self.views[user_id]
        return [dict(view.known()[cid]) for cid in sorted(view.known())]


def repairer_for(
    core: WorkerCore, store: InMemoryProjectionStore, chunk_users: int = 2
) -> ProjectionRepairer:
    return ProjectionRepairer(core, store, RepairConfig(interval_ms=1000, chunk_users=chunk_users))


async def settle(core: WorkerCore, repairer: ProjectionRepairer, clock: Clock) -> None:
    """Checks and repairs until nothing is left, the windows flushed in between."""
    for _ in range(10):
        await repairer.check()
        await repairer.work()
        clock.now += 1_000
        await core.flush_due(clock.now)
        if not repairer.jobs and not core.store_behind:
            return
    raise AssertionError(f"the repair does not settle: {repairer.jobs}")


def user_rows(rows: list[dict[str, Any]], user_id: int) -> list[dict[str, Any]]:
    return [row for row in rows if row["user_id"] == user_id]


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    stream=streams(scenarios(min_steps=20, max_steps=90), full=True),
    seed=st.integers(0, 2**32 - 1),
    restart=st.booleans(),
    hot_rows=st.sampled_from([500_000, 2]),
)
def test_a_store_emptied_mid_stream_is_repaired_and_clients_converge(
    stream: Stream, seed: int, restart: bool, hot_rows: int
) -> None:
    """FLUSHALL (or a restart without persistence) at a random point; flushes go on into the
    emptied store before the worker notices (partial users at new versions); devices pull during
    the loss. In the end the store and every device equal replay."""
    lines = [line for line in stream.lines() if line.strip()]
    lanes = stream.lanes
    expected = run_replay(lines, ReplayOptions(lanes=lanes))
    users = [b["user_id"] for b in expected.badges]
    rnd = random.Random(seed)
    store = message_store_for(lines, lanes)
    tables, projections, outbox, clock = MemoryTables(), InMemoryProjectionStore(), Outbox(), Clock()
    devices = Devices(outbox, projections)

    async def run() -> None:
        core = make_core(lanes, tables, store, projections, outbox, clock, hot_rows=hot_rows)
        repairer = repairer_for(core, projections, chunk_users=rnd.choice((1, 3, 256)))
        parts = batches(records(lines), rnd)
        cut = rnd.randrange(len(parts) + 1)
        noticed = rnd.randrange(cut, len(parts) + 1)
        for index, batch in enumerate(parts):
            if index == cut:
                projections.flushall(restart=restart)
                for user_id in rnd.sample(users, min(3, len(users))):
                    await devices.pull(user_id)  # a device (re)opened during the loss
            if index == noticed:
                await settle(core, repairer, clock)
            await core.on_records(batch)
            clock.now += rnd.choice((0, 60, 150))
            await core.flush_due(clock.now)
            await devices.follow()
        if cut == len(parts):
            projections.flushall(restart=restart)
        await core.flush_all()
        await settle(core, repairer, clock)
        await devices.follow()

    asyncio.run(run())
    rows, badges = asyncio.run(final_projection(projections, users))
    assert rows == expected.projections
    assert badges == expected.badges
    for badge in expected.badges:
        user_id = badge["user_id"]
        if user_id in devices.views:
            view = devices.views[user_id]
            assert devices.rows(user_id) == user_rows(expected.projections, user_id)
            held = view.badge
            assert held is not None
            assert (held.total_unread, held.total_mention, held.muted_unread) == (
                badge["total_unread"],
                badge["total_mention"],
                badge["muted_unread"],
            )


def two_users() -> list[bytes]:
    s = Builder()
    for n in range(1, 4):
        s.message(7, n, conv=CONV_A)
        s.message(8, n, conv=CONV_B)
    s.message(7, 1, conv=CONV_B)
    return s.close()


async def worker(
    lines: Sequence[bytes], hot_rows: int = 500_000, messages: Sequence[bytes] = ()
) -> tuple[WorkerCore, InMemoryProjectionStore, Outbox, Clock]:
    """`lines` applied and flushed; the MessageStore holds their messages (and `messages`'s: a
    stream's later part, applied afterwards)."""
    tables, projections, outbox, clock = MemoryTables(), InMemoryProjectionStore(), Outbox(), Clock()
    store = message_store_for([*lines, *messages], 1)
    core = make_core(1, tables, store, projections, outbox, clock, hot_rows=hot_rows)
    await core.on_records(records(lines))
    await core.flush_all()
    return core, projections, outbox, clock


def test_an_intact_store_is_only_checked_and_its_markers_set() -> None:
    lines = two_users()

    async def run() -> None:
        core, projections, outbox, clock = await worker(lines)
        repairer = repairer_for(core, projections)
        frames = len(outbox.frames_out)
        await settle(core, repairer, clock)  # first sight: no markers yet, every user checked
        assert core.stats.projection_restores == 0 and core.stats.restore_checked_users == 2
        assert core.stats.restored_users == 0 and len(outbox.frames_out) == frames
        assert (await projections.read_markers([0]))[0][0].startswith(DONE)  # type: ignore[union-attr]
        await settle(core, repairer, clock)  # nothing lost since: nothing done
        assert core.stats.projection_restores == 0 and core.stats.restore_checked_users == 2

    asyncio.run(run())


async def pending_after_a_flush(
    first: list[bytes], second: list[bytes]
) -> tuple[WorkerCore, InMemoryProjectionStore, Clock, ProjectionRepairer]:
    """`first` applied and flushed, `second` applied with its window still open; a repairer that
    has not looked at the store yet."""
    core, projections, _, clock = await worker(first, messages=second)
    await core.on_records(records(second, len(first)))
    return core, projections, clock, repairer_for(core, projections)


def test_first_sight_while_users_have_new_rows_not_flushed_yet_repairs_nothing() -> None:
    """The CI failure of ebff8eb and e14c6c5: a store seen for the first time while a user had
    applied entries (a new conversation among them) not flushed yet. The store holds what the
    user's last flush wrote; the state has one row more, its next flush's. Nothing was lost."""
    s = Builder()
    for n in range(1, 4):
        s.message(7, n, conv=CONV_A)
        s.message(8, n, conv=CONV_B)
    first = s.close_part()
    s.message(7, 1, conv=CONV_B)  # a row the store has never seen
    s.message(8, 4, conv=CONV_B)  # a row the store holds at an older value
    second = s.close()

    async def run() -> None:
        core, projections, clock, repairer = await pending_after_a_flush(first, second)
        await repairer.check()
        await repairer.work()
        assert core.stats.projection_restores == 0 and core.stats.restore_checked_users == 2
        assert core.stats.restore_reflushed_users == 0
        await core.flush_all()
        await settle(core, repairer, clock)
        assert core.stats.projection_restores == 0
        rows, badges = await final_projection(projections, [7, 8])
        expected = run_replay(first + second, ReplayOptions(lanes=1))
        assert (rows, badges) == (expected.projections, expected.badges)

    asyncio.run(run())


def test_a_lost_row_of_a_user_with_entries_not_flushed_is_handed_to_its_next_flush() -> None:
    """The same user with a row of its last flush gone from the store (the store kept the
    version): the count of rows left at that version finds it, and the next flush writes the
    user whole."""
    s = Builder()
    s.message(7, 1, conv=CONV_A)
    s.message(7, 1, conv=CONV_B)
    first = s.close_part()
    s.message(7, 2, conv=CONV_B)
    second = s.close()

    async def run() -> None:
        core, projections, _, repairer = await pending_after_a_flush(first, second)
        await repairer.check()
        await repairer.work()  # first sight: markers set, nothing lost
        assert core.stats.projection_restores == 0
        projections.forget_rows(7, [CONV_A])
        await projections.set_markers(0, RESTORING + "a-dead-worker")  # the partition checked again
        await repairer.check()
        await repairer.work()
        assert core.stats.projection_restores == 1 and core.stats.restore_reflushed_users == 1
        await core.flush_all()
        rows, badges = await final_projection(projections, [7])
        expected = run_replay(first + second, ReplayOptions(lanes=1))
        assert (rows, badges) == (expected.projections, expected.badges)

    asyncio.run(run())


def test_a_flushall_is_repaired_at_the_same_versions_with_correction_frames() -> None:
    lines = two_users()
    expected = run_replay(lines, ReplayOptions())

    async def run() -> None:
        core, projections, outbox, clock = await worker(lines)
        repairer = repairer_for(core, projections)
        await settle(core, repairer, clock)
        versions = await projections.versions([7, 8])
        frames = len(outbox.frames_out)
        projections.flushall()
        await settle(core, repairer, clock)
        assert await projections.versions([7, 8]) == versions  # never lower, never a new one
        assert core.stats.projection_restores == 1 and core.stats.restored_users == 2
        assert core.stats.restored_rows == 3
        restated = outbox.frames_out[frames:]
        assert len(restated) == 4 and all(f["correction"] for f in restated)
        assert all(f["prev_projection_mailbox_seq"] == f["projection_mailbox_seq"] for f in restated)
        assert await final_projection(projections, [7, 8]) == (expected.projections, expected.badges)

    asyncio.run(run())


def test_a_restart_with_persistence_that_lost_the_last_writes_is_found_by_the_run_id() -> None:
    """An RDB snapshot older than the last flush: the markers are there, user 8 is at an older
    version; the servers' run ids changed."""
    s = Builder()
    s.message(7, 1)
    s.message(8, 1, conv=CONV_B)
    first = s.close_part()
    s.message(8, 2, conv=CONV_B)
    second = s.close()
    expected = run_replay([*first, *second], ReplayOptions())

    async def run() -> None:
        tables, projections, outbox, clock = MemoryTables(), InMemoryProjectionStore(), Outbox(), Clock()
        core = make_core(1, tables, message_store_for([*first, *second], 1), projections, outbox, clock)
        repairer = repairer_for(core, projections)
        await core.on_records(records(first))
        await core.flush_all()
        await settle(core, repairer, clock)
        old = await projections.load(8)
        await core.on_records(records(second, len(first)))
        await core.flush_all()
        # The restart: user 8 back to its older copy (the snapshot), a new run id.
        projections.forget([8])
        await projections.write([_as_flush(old)])
        projections._run_id += 1
        await settle(core, repairer, clock)
        assert core.stats.restored_users == 1
        assert await final_projection(projections, [7, 8]) == (expected.projections, expected.badges)

    asyncio.run(run())


def _as_flush(stored: Any) -> Any:
    from app.domain.badge import Badge as StoreBadge
    from app.domain.flush import UserFlush

    return UserFlush(
        user_id=stored.user_id,
        rows=list(stored.rows.values()),
        badge=StoreBadge(stored.total_unread, stored.total_mention, stored.muted_unread),
        projection_mailbox_seq=stored.projection_mailbox_seq,
        prev_projection_mailbox_seq=0,
        structure_version=stored.structure_version,
        driving_event_id="",
        driving_mailbox_seq=stored.projection_mailbox_seq,
    )


def test_users_evicted_from_the_store_are_repaired_once_a_flush_finds_them_missing() -> None:
    s = Builder()
    s.message(7, 1, conv=CONV_A)
    s.message(7, 1, conv=CONV_B)
    first = s.close_part()
    s.message(7, 2, conv=CONV_A)
    second = s.close()
    expected = run_replay([*first, *second], ReplayOptions())

    async def run() -> None:
        tables, projections, outbox, clock = MemoryTables(), InMemoryProjectionStore(), Outbox(), Clock()
        core = make_core(1, tables, message_store_for([*first, *second], 1), projections, outbox, clock)
        repairer = repairer_for(core, projections)
        await core.on_records(records(first))
        await core.flush_all()
        await settle(core, repairer, clock)
        projections.forget([7])  # evicted: markers intact, run id the same
        await core.on_records(records(second, len(first)))
        await core.flush_all()  # writes CONV_A alone into the empty user
        assert core.store_behind == {7}
        assert len((await projections.load(7)).rows) == 1
        await settle(core, repairer, clock)
        assert await final_projection(projections, [7]) == (expected.projections, expected.badges)

    asyncio.run(run())


def test_a_crash_in_the_middle_of_a_repair_is_finished_by_the_next_worker() -> None:
    s = Builder()
    for user in range(1, 30):
        s.message(user, 1)
    lines = s.close()
    expected = run_replay(lines, ReplayOptions())
    users = [b["user_id"] for b in expected.badges]

    async def run() -> None:
        core, projections, outbox, clock = await worker(lines)
        repairer = repairer_for(core, projections, chunk_users=4)
        await settle(core, repairer, clock)
        projections.flushall()
        await repairer.check()
        job = repairer.jobs.pop(0)
        repairer.jobs[0] = job
        # Two chunks, then the process dies (the task is simply never resumed).
        chunks = 0
        real = repairer._chunk

        async def counted(state: PartitionState, chunk: list[int], report: RepairReport) -> bool:
            nonlocal chunks
            chunks += 1
            if chunks > 2:
                raise asyncio.CancelledError
            return await real(state, chunk, report)

        repairer._chunk = counted  # type: ignore[method-assign]
        with contextlib.suppress(asyncio.CancelledError):
            await repairer.work()
        (marker,) = (await projections.read_markers([0]))[0]
        assert marker is not None and marker.startswith(RESTORING)
        assert 0 < len(await projections.user_ids()) < len(users)
        # The next worker restores its state from the changelog tables and finishes the repair.
        restarted = make_core(1, core.tables, core.message_store, projections, outbox, clock)  # type: ignore[arg-type]
        await restarted.restore_assigned([0])
        await settle(restarted, repairer_for(restarted, projections), clock)
        assert await final_projection(projections, users) == (expected.projections, expected.badges)

    asyncio.run(run())


def test_a_chunk_waits_while_the_partition_has_flushes_not_published() -> None:
    """A flush the store refused to take (held: the store failing) goes first: the repair of
    that partition waits for it rather than writing under it."""
    lines = two_users()

    async def run() -> None:
        core, projections, _outbox, clock = await worker(lines)
        repairer = repairer_for(core, projections)
        await settle(core, repairer, clock)
        state = core.partitions[0]
        state.unpublished.append([])  # stands for a held flush
        projections.flushall()
        await repairer.check()
        task = asyncio.ensure_future(repairer.work())
        for _ in range(5):
            await asyncio.sleep(0.06)
        assert not task.done() and core.stats.restored_users == 0
        state.unpublished.clear()
        await task
        assert core.stats.restored_users == 2

    asyncio.run(run())


def test_a_repair_streams_the_users_from_the_tables_and_keeps_the_hot_set_bounded() -> None:
    """State bigger than the hot set: users come from the tables in chunks, are not kept."""
    s = Builder()
    for user in range(1, 200):
        s.message(user, 1)
    lines = s.close()
    expected = run_replay(lines, ReplayOptions())
    users = [b["user_id"] for b in expected.badges]

    async def run() -> None:
        core, projections, _outbox, clock = await worker(lines, hot_rows=10)
        repairer = repairer_for(core, projections, chunk_users=16)
        await core.persist(core.partitions[0])  # evicts down to the bound
        assert core.partitions[0].processor.resident_rows <= 10
        projections.flushall()
        await settle(core, repairer, clock)
        assert core.stats.restored_users == len(users)
        assert core.partitions[0].processor.resident_rows <= 10
        assert await final_projection(projections, users) == (expected.projections, expected.badges)

    asyncio.run(run())
