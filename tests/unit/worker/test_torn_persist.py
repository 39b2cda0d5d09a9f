"""A worker killed while the broker acknowledges a persist: the records of one persist go to
several changelog partitions, so any subset of a step can be delivered (a checkpoint must never
be taken ahead of its rows). The
tables deliver a persist in three steps (gate intent, data, gate: `StateTables.commit`); here a
commit dies in any of them, with any subset of that step delivered, and the restarted worker's
projection must still be replay's."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given
from hypothesis import strategies as st

from app.stores.memory_tables import TornCommit
from app.worker.core import WorkerCore
from app.worker.ports import RawRecord
from tests.support.clock import ManualClock
from tests.support.projection_files import as_replay_files
from tests.support.strategies import Stream, scenarios, streams
from tests.support.worker import WHOLE_STREAMS, StreamRig, batches


async def feed_until_torn(
    core: WorkerCore, batch_list: list[list[RawRecord]], clock: ManualClock, rnd: random.Random
) -> bool:
    """Feed the batches; True when a commit died on the way (the worker is dead then)."""
    try:
        for batch in batch_list:
            await core.on_records(batch)
            clock.now += rnd.choice((0, 10, 60, 150))
            await core.flush_due(clock.now)
        await core.flush_all()
    except TornCommit:
        return True
    return False


@WHOLE_STREAMS
@given(
    stream=st.one_of(streams(), streams(scenarios(min_steps=30, max_steps=120))),
    seed=st.integers(0, 2**32 - 1),
    hot_rows=st.sampled_from([500_000, 3]),
)
def test_a_persist_torn_by_a_kill_loses_nothing(stream: Stream, seed: int, hot_rows: int) -> None:
    rig = StreamRig(stream, seed, hot_rows)
    rnd, clock = rig.rnd, rig.clock

    async def run() -> None:
        core = rig.new_core()
        parts = batches(rig.records, rnd)
        cut = rnd.randrange(len(parts) + 1)
        if await feed_until_torn(core, parts[:cut], clock, rnd):
            raise AssertionError("no commit was torn yet")
        rig.tables.tear_next_commit(rnd)
        if await feed_until_torn(core, parts[cut:], clock, rnd):
            # SIGKILL mid-commit: memory is gone; the tables hold the torn persist's delivered
            # records; offsets were committed at most up to the last whole persist.
            crashed = core.partitions.get(0)
            core = rig.new_core()
            again = rig.reread_from(crashed.durable_offset if crashed is not None else None)
            assert not await feed_until_torn(core, batches(again, rnd), clock, rnd)

    asyncio.run(run())
    expected = rig.expected
    rows, badges = asyncio.run(as_replay_files(rig.projections, [b["user_id"] for b in expected.badges]))
    assert rows == expected.projections
    assert badges == expected.badges


async def feed_through_failures(
    core: WorkerCore, batch_list: list[list[RawRecord]], clock: ManualClock, rnd: random.Random, fail: float
) -> int:
    """Feed the batches while commits fail now and then (the broker refused a persist past its
    timeouts, after delivering part of it) and the worker goes on, as it does: the agent is
    restarted on the batch that raised (its entries are applied), the flush scheduler retries at
    its next deadline. Returns the failures."""
    failures = 0
    tables = core.tables
    for batch in batch_list:
        if rnd.random() < fail:
            tables.tear_next_commit(rnd)  # type: ignore[attr-defined]  # MemoryTables
        try:
            await core.on_records(batch)
        except TornCommit:
            failures += 1
        clock.now += rnd.choice((0, 10, 60, 150))
        try:
            await core.flush_due(clock.now)
        except TornCommit:
            failures += 1
    return failures


@WHOLE_STREAMS
@given(
    stream=st.one_of(streams(), streams(scenarios(min_steps=30, max_steps=120))),
    seed=st.integers(0, 2**32 - 1),
    hot_rows=st.sampled_from([500_000, 3]),
)
def test_a_failed_persist_the_worker_survives_is_carried_by_the_next_ones(
    stream: Stream, seed: int, hot_rows: int
) -> None:
    """A commit that raised took the persist's changes with it: the flush scheduler "retried at
    the next deadline" only what changed after, while later gates moved past the entries behind
    the lost row records. A restart then restored those rows older than their entries. The
    changes of a failed persist go to the next one; a kill at the end loses nothing."""
    rig = StreamRig(stream, seed, hot_rows)
    rnd, clock = rig.rnd, rig.clock

    async def run() -> None:
        core = rig.new_core()
        await feed_through_failures(core, batches(rig.records, rnd), clock, rnd, fail=0.3)
        while True:  # the scheduler's retries, until a persist goes through
            try:
                await core.flush_all()
                break
            except TornCommit:
                clock.now += 100
        # SIGKILL now: memory gone, the tables and the durable offset are what is left.
        crashed = core.partitions.get(0)
        restarted = rig.new_core()
        again = rig.reread_from(crashed.durable_offset if crashed is not None else None)
        for batch in batches(again, rnd):
            await restarted.on_records(batch)
        await restarted.flush_all()

    asyncio.run(run())
    expected = rig.expected
    rows, badges = asyncio.run(as_replay_files(rig.projections, [b["user_id"] for b in expected.badges]))
    assert rows == expected.projections
    assert badges == expected.badges
