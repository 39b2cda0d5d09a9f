"""The worker core with its flushes overlapping the intake (issue 14, "frames on time"): a
persist's changelog commit is awaited without the state lock, and a batch's flushes are
published by the flush scheduler, not by the batch. What must hold whatever the interleaving:

* durable before visible: a user's version reaches the projection store only once the changelog
  holds the user's state at that version (checked at every store write);
* offsets: the durable offset never runs ahead of the committed changelog;
* the final projection (with a crash anywhere, commits included) is replay's.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.flush import UserFlush
from app.domain.projector import ProjectorConfig
from app.replay import ReplayOptions, run_replay
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from app.worker.core import WorkerConfig, WorkerCore
from app.worker.ports import RawRecord
from tests.support.builders import CONV_A, CONV_B
from tests.support.builders import StreamBuilder as Builder
from tests.support.clock import ManualClock
from tests.support.projection_files import as_replay_files
from tests.support.strategies import Stream, scenarios, streams
from tests.support.worker import RecordingOutbox, flush_scheduler, message_store_for, records


class SlowTables(MemoryTables):
    """A changelog whose acknowledgement takes a while: the staged records are taken at once
    (as the faust tables hand them to the producer), applied after some event-loop turns, or
    only when `hold` is cleared. Records staged but not applied are lost by a crash."""

    def __init__(self, rnd: random.Random | None = None) -> None:
        super().__init__()
        self.rnd = rnd
        self.hold: asyncio.Event | None = None
        self.waiting = asyncio.Event()
        self.commits = 0

    async def commit(self) -> None:
        staged, self._staged = self._staged, []
        if self.hold is not None:
            self.waiting.set()
            await self.hold.wait()
        for _ in range(self.rnd.randint(0, 4) if self.rnd is not None else 0):
            await asyncio.sleep(0)
        for partition, name, key, value in staged:  # acknowledged: in the changelog now
            table = self._table(partition, name)
            if value is None:
                table.pop(key, None)
            else:
                table[key] = value
        self.commits += 1


class CheckedStore(InMemoryProjectionStore):
    """Fails the test if a version reaches it before the changelog holds it."""

    def __init__(self, tables: MemoryTables) -> None:
        super().__init__()
        self.tables = tables
        self.published: list[tuple[int, int]] = []

    async def write(self, batches: Sequence[UserFlush]) -> list[int | None]:
        for batch in batches:
            raw = self.tables.get_users(0, [batch.user_id]).get(batch.user_id)
            assert raw is not None, f"user {batch.user_id} published before the changelog had it"
            persisted = msgspec.msgpack.decode(raw)["projection_mailbox_seq"]
            assert persisted >= batch.projection_mailbox_seq, (
                f"user {batch.user_id}: version {batch.projection_mailbox_seq} published, "
                f"the changelog holds {persisted}"
            )
            self.published.append((batch.user_id, batch.projection_mailbox_seq))
        return await super().write(batches)


def background_core(
    lanes: int,
    tables: MemoryTables,
    store: InMemoryMessageStore,
    projections: InMemoryProjectionStore,
    clock: ManualClock,
    *,
    max_dirty_rows: int = 100_000,
    hot_rows: int = 500_000,
) -> WorkerCore:
    config = WorkerConfig(
        lanes=lanes,
        projector=ProjectorConfig(
            window_ms=100, max_dirty_rows=max_dirty_rows, include_muted=False, unread_precise_limit=200
        ),
        hot_rows=hot_rows,
    )
    core = WorkerCore(
        config,
        message_store=store,
        projection_store=projections,
        tables=tables,
        outbox=RecordingOutbox(),
        clock=clock,
    )
    # As the worker runs with PROJECTOR_WORKER_OVERLAP_FLUSHES=true.
    core.background_publish = True
    core.commit_outside_state_lock = True
    return core


def test_a_batch_goes_on_while_a_flush_waits_for_the_changelog_and_its_own_flush_for_its_persist() -> None:
    s = Builder()
    s.message(7, 1, conv=CONV_A)
    first = s.close_part()
    s.message(7, 2, conv=CONV_B)
    second = s.close_part()
    s.message(8, 3, conv=CONV_A)
    third = s.close()
    lines = [*first, *second, *third]
    expected = run_replay(lines, ReplayOptions())
    store = message_store_for(lines, 1)
    clock = ManualClock()

    async def run() -> None:
        tables = SlowTables()
        projections = CheckedStore(tables)
        core = background_core(1, tables, store, projections, clock)
        await core.on_records(records(first))
        clock.now += 150  # the window of `first` is over
        tables.hold = asyncio.Event()
        flushing = asyncio.create_task(core.flush_due(clock.now))
        await asyncio.wait_for(tables.waiting.wait(), 10)  # its persist waits for the changelog
        # The intake is not held by it: the next window's batch is applied meanwhile, and a
        # later batch closes that window, queueing its flush (the scheduler is woken for it).
        await asyncio.wait_for(core.on_records(records(second, len(first))), 10)
        clock.now += 150
        await asyncio.wait_for(core.on_records(records(third, len(first) + len(second))), 10)
        state = core.partitions[0]
        assert len(state.unpublished) == 2 and core.publish_wanted.is_set()
        assert projections.published == []  # nothing visible before its persist is in
        tables.hold.set()
        tables.hold = None
        await asyncio.wait_for(flushing, 10)
        # The first flush went out; the second was queued after that persist's snapshot, so it
        # waits for a persist of its own (the scheduler's next round).
        assert [v for _, v in projections.published] == [1]
        assert len(state.unpublished) == 1
        await core.flush_due(clock.now)
        assert sorted(projections.published) == [(7, 1), (7, 2)]
        await core.flush_all()
        rows, badges = await as_replay_files(projections, [7, 8])
        assert rows == expected.projections and badges == expected.badges

    asyncio.run(run())


def test_nothing_of_a_released_partition_is_written_after_its_hand_over() -> None:
    """A flush the scheduler had not published when the partition was handed over: its round
    after the hand-over writes neither the changelog (another worker owns it now) nor the store;
    the new owner flushes that work from the hand-over's records."""
    s = Builder()
    s.message(7, 1, conv=CONV_A)
    first = s.close_part()
    s.message(8, 2, conv=CONV_B)
    second = s.close()
    lines = [*first, *second]
    expected = run_replay(lines, ReplayOptions())
    store = message_store_for(lines, 1)
    clock = ManualClock()

    async def run() -> None:
        tables = SlowTables()
        projections = CheckedStore(tables)
        core = background_core(1, tables, store, projections, clock)
        await core.on_records(records(first))
        clock.now += 150
        await core.on_records(records(second, len(first)))  # closes the window: a flush queued
        assert core.partitions[0].unpublished and core.publish_wanted.is_set()
        await core.release([0])
        handed_over = {name: dict(table) for name, table in tables.data[0].items()}
        await core.flush_due(clock.now + 1000)  # the scheduler's round, too late
        await core.persist(core.partitions[0])
        assert {name: dict(table) for name, table in tables.data[0].items()} == handed_over
        assert projections.published == []
        core.forget([0])
        owner = background_core(1, tables, store, projections, clock)
        await owner.restore_assigned([0])
        clock.now += 10_000
        await owner.flush_due(clock.now)
        await owner.flush_all()
        rows, badges = await as_replay_files(projections, [7, 8])
        assert rows == expected.projections and badges == expected.badges

    asyncio.run(run())


SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(
    stream=st.one_of(streams(), streams(scenarios(min_steps=30, max_steps=120))),
    seed=st.integers(0, 2**32 - 1),
    crash=st.booleans(),
    hot_rows=st.sampled_from([500_000, 500_000, 2]),
    max_dirty_rows=st.sampled_from([100_000, 3]),
)
def test_overlapping_flushes_and_batches_stay_durable_before_visible_and_end_as_replay(
    stream: Stream, seed: int, crash: bool, hot_rows: int, max_dirty_rows: int
) -> None:
    """Batches and a flush scheduler run concurrently over a changelog that acknowledges after a
    random number of event-loop turns; optionally everything is killed at a random moment
    (commits in flight lost) and a new core re-reads from the durable offset."""
    lines = [line for line in stream.lines() if line.strip()]
    expected = run_replay(lines, ReplayOptions(lanes=stream.lanes))
    rnd = random.Random(seed)
    store = message_store_for(lines, stream.lanes)
    clock = ManualClock()
    recs = records(lines)

    async def drive(core: WorkerCore, recs: list[RawRecord], steps: int | None) -> None:
        """Feed batches while a scheduler task flushes; stop after `steps` batches (a kill)."""
        stop = asyncio.Event()

        task = asyncio.create_task(flush_scheduler(core, clock, rnd, stop))
        i = done = 0
        while i < len(recs) and (steps is None or done < steps):
            size = rnd.randint(1, 12)
            await core.on_records(recs[i : i + size])
            i += size
            done += 1
            clock.now += rnd.choice((0, 10, 60, 150))
            for _ in range(rnd.randint(0, 3)):
                await asyncio.sleep(0)
        stop.set()
        if steps is not None:
            task.cancel()  # SIGKILL: whatever was in flight is gone
            with contextlib.suppress(asyncio.CancelledError):
                await task
        else:
            await task

    async def run() -> InMemoryProjectionStore:
        tables = SlowTables(rnd)
        projections = CheckedStore(tables)

        def new_core() -> WorkerCore:
            return background_core(
                stream.lanes,
                tables,
                store,
                projections,
                clock,
                max_dirty_rows=max_dirty_rows,
                hot_rows=hot_rows,
            )

        core = new_core()
        if crash and recs:
            await drive(core, recs, rnd.randint(0, 12))
            crashed = core.partitions.get(0)
            durable = crashed.durable_offset if crashed is not None else None
            tables._staged = []  # staged, never acknowledged: lost with the process
            core = new_core()
            await core.restore_assigned([0])
            await drive(core, recs[max(0, (durable or 0) - rnd.randint(0, 5)) :], None)
        else:
            await drive(core, recs, None)
        await core.flush_all()
        return projections

    projections = asyncio.run(run())
    rows, badges = asyncio.run(as_replay_files(projections, [b["user_id"] for b in expected.badges]))
    assert rows == expected.projections
    assert badges == expected.badges
