"""A worker never dies on a failing projection store (issue 15): with a store backoff, a flush
whose write raises stays queued, its users' changelog records keep saying "not flushed", no write
is tried before the backoff allows, one line is logged per failure streak, and once the store
writes again the projection is replay's — also after a crash in the middle of the outage."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.replay import ReplayOptions, run_replay
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from app.worker.core import WorkerCore
from app.worker.retry import Backoff
from tests.support.builders import CONV_A, CONV_B, StreamBuilder
from tests.support.clock import ManualClock
from tests.support.projection_files import as_replay_files
from tests.support.strategies import Stream, scenarios, streams
from tests.support.worker import (
    WHOLE_STREAMS,
    RecordingOutbox,
    batches,
    make_core,
    message_store_for,
    records,
)


class StoreDown(ConnectionError):
    pass


class FlakyStore(InMemoryProjectionStore):
    """A projection store whose writes raise while `down` (nothing is written then)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.attempts = 0

    async def write(self, batches: Any) -> Any:
        self.attempts += 1
        if self.down:
            raise StoreDown("connection refused")
        return await super().write(batches)


def with_backoff(core: WorkerCore, seed: int = 0) -> WorkerCore:
    core.store_backoff = Backoff(first_delay_ms=100, max_delay_ms=1_000, rng=random.Random(seed))
    return core


def flushed_seq(tables: MemoryTables, user_id: int) -> int:
    """The last flushed version the user's changelog record says (partition 0)."""
    record: dict[str, Any] = msgspec.msgpack.decode(tables.get_users(0, [user_id])[user_id])
    return int(record["flushed_seq"])


def two_users() -> list[bytes]:
    s = StreamBuilder()
    s.message(7, 1, conv=CONV_A)
    s.message(8, 1, conv=CONV_B)
    s.message(7, 2, conv=CONV_B)
    return s.close()


def test_a_failing_write_is_held_logged_once_and_published_when_the_store_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = two_users()
    expected = run_replay(lines, ReplayOptions())
    tables, projections, outbox, clock = MemoryTables(), FlakyStore(), RecordingOutbox(), ManualClock()
    core = with_backoff(make_core(1, tables, message_store_for(lines, 1), projections, outbox, clock))

    async def run() -> tuple[list[Any], list[Any]]:
        projections.down = True
        await core.on_records(records(lines))
        clock.now += 1_000
        await core.flush_due(clock.now)  # the window closed: the write raises, nothing escapes
        assert core.store_failing and core.stats.store_write_failures == 1
        held = core.held_flushes()
        assert held == 2 and core.partitions[0].unpublished
        assert core.held_rows() == 3  # user 7's two rows, user 8's one
        # The changelog says "not flushed" for both users (a restart flushes them again).
        assert flushed_seq(tables, 7) == flushed_seq(tables, 8) == 0
        attempts = projections.attempts
        for _ in range(20):  # no attempt before the backoff allows one
            await core.flush_due(clock.now)
        assert projections.attempts == attempts
        for _ in range(5):  # attempts while the store stays down: counted, not logged again
            clock.now += 2_000
            await core.flush_due(clock.now)
        assert core.stats.store_write_failures == 1 + 5
        assert core.held_flushes() == held and not outbox.frames_out  # nothing published, nothing lost
        projections.down = False
        clock.now += 2_000
        await core.flush_due(clock.now)
        assert not core.store_failing and core.held_flushes() == 0
        assert len(outbox.frames_out) == 4  # a SESSION_DELTA and a BADGE_UPDATE per user
        await core.flush_all()
        assert flushed_seq(tables, 7) > 0 and flushed_seq(tables, 8) > 0
        return await as_replay_files(projections, [7, 8])

    with caplog.at_level(logging.DEBUG, logger="projector.worker"):
        rows, badges = asyncio.run(run())
    assert (rows, badges) == (expected.projections, expected.badges)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.levelname for r in loud] == ["ERROR", "WARNING"], [r.getMessage() for r in loud]
    first = loud[0].getMessage()
    assert "writing a flush failed (StoreDown: connection refused); 2 flushes held" in first
    assert "after 6 failed attempts" in loud[1].getMessage()
    assert all(r.exc_info is None for r in caplog.records)  # no traceback per attempt


def test_without_a_backoff_a_failing_write_still_raises() -> None:
    """Rebuild and replay drive the core without a backoff: a failing store is their error."""
    lines = two_users()
    tables, projections, outbox, clock = MemoryTables(), FlakyStore(), RecordingOutbox(), ManualClock()
    core = make_core(1, tables, message_store_for(lines, 1), projections, outbox, clock)
    projections.down = True

    async def run() -> None:
        await core.on_records(records(lines))
        await core.flush_all()

    with pytest.raises(StoreDown):
        asyncio.run(run())
    assert core.held_flushes() == 2  # still queued: the lead's rule (the changelog says unflushed)


def test_held_flushes_cost_no_changelog_writes_while_nothing_changes() -> None:
    """Every persist writes the held users' records again: while held, a partition persists at
    most once per window, and not at all once nothing changes (the intake is paused)."""
    lines = two_users()
    tables, projections, outbox, clock = MemoryTables(), FlakyStore(), RecordingOutbox(), ManualClock()
    core = with_backoff(make_core(1, tables, message_store_for(lines, 1), projections, outbox, clock))
    writes: list[int] = []
    put_user = tables.put_user

    def counting_put_user(partition: int, user_id: int, blob: bytes) -> None:
        writes.append(user_id)
        put_user(partition, user_id, blob)

    tables.put_user = counting_put_user  # type: ignore[method-assign]

    async def run() -> None:
        projections.down = True
        await core.on_records(records(lines))
        clock.now += 1_000
        await core.flush_due(clock.now)
        before = len(writes)
        for _ in range(50):
            clock.now += 10
            await core.flush_due(clock.now)
        assert len(writes) == before

    asyncio.run(run())


@WHOLE_STREAMS
@given(
    stream=st.one_of(streams(), streams(scenarios(min_steps=30, max_steps=120))),
    seed=st.integers(0, 2**32 - 1),
    crash=st.booleans(),
)
def test_an_outage_anywhere_ends_in_replays_projection(stream: Stream, seed: int, crash: bool) -> None:
    """The store goes down and comes back at random points of the stream (several times), the
    batching and the clock are random, and the worker may be killed during an outage (its memory
    gone: held flushes included; the tables and the store survive): replay's projection."""
    lines = [line for line in stream.lines() if line.strip()]
    expected = run_replay(lines, ReplayOptions(lanes=stream.lanes))
    rnd = random.Random(seed)
    store = message_store_for(lines, stream.lanes)
    tables, projections, outbox, clock = MemoryTables(), FlakyStore(), RecordingOutbox(), ManualClock()
    recs = records(lines)

    def new_core() -> WorkerCore:
        return with_backoff(make_core(stream.lanes, tables, store, projections, outbox, clock), seed)

    async def run() -> tuple[list[Any], list[Any]]:
        core = new_core()
        parts = batches(recs, rnd)
        cut = rnd.randrange(len(parts)) if crash and parts else None
        for index, batch in enumerate(parts):
            if rnd.random() < 0.2:
                projections.down = not projections.down
            if cut is not None and index >= cut and core.held_flushes():
                cut = None  # once, while flushes are held
                crashed = core.partitions[0]
                durable = crashed.durable_offset
                core = new_core()  # SIGKILL: re-read from the durable offset (or a bit before)
                batch = recs[max(0, (durable or 0) - rnd.randint(0, 5)) : batch[-1].offset + 1]
            await core.on_records(batch)
            clock.now += rnd.choice((0, 10, 60, 150, 400))
            await core.flush_due(clock.now)
        projections.down = False
        clock.now += 5_000  # past any backoff
        await core.flush_due(clock.now)
        await core.flush_all()
        assert core.held_flushes() == 0 and not core.store_failing
        return await as_replay_files(projections, [b["user_id"] for b in expected.badges])

    rows, badges = asyncio.run(run())
    assert rows == expected.projections
    assert badges == expected.badges


def test_backoff_doubles_with_jitter_up_to_its_cap_and_a_success_ends_the_streak() -> None:
    backoff = Backoff(first_delay_ms=100, max_delay_ms=1_000, rng=random.Random(1))
    assert backoff.ready(0) and not backoff.failing and backoff.succeeded(0) is None
    assert [backoff.delay_ms(n) for n in range(1, 7)] == [100, 200, 400, 800, 1000, 1000]
    now = 0
    starts = []
    for n in range(1, 8):
        starts.append(backoff.failed(now, f"error {n}"))
        wait = backoff.retry_at_ms - now
        assert backoff.delay_ms(n) // 2 <= wait <= backoff.delay_ms(n)
        assert not backoff.ready(now + wait - 1) and backoff.ready(now + wait)
        now += wait
    assert starts == [True] + [False] * 6  # one streak
    streak = backoff.succeeded(now + 5)
    assert streak is not None and (streak.failures, streak.last_error) == (7, "error 7")
    assert streak.duration_ms == now + 5
    assert not backoff.failing and backoff.ready(now)
    assert backoff.failed(now, "again")  # a new streak
    with pytest.raises(ValueError):
        Backoff(first_delay_ms=0)


def test_held_flushes_handed_over_with_their_partition_are_flushed_by_the_new_owner() -> None:
    """A rebalance during the outage: the partition's held flushes go with it (its changelog
    records say "not flushed"), this worker holds nothing any more (its intake may fetch what it
    owns now), and the new owner writes them once the store answers."""
    lines = two_users()
    expected = run_replay(lines, ReplayOptions())
    tables, projections, outbox, clock = MemoryTables(), FlakyStore(), RecordingOutbox(), ManualClock()
    store = message_store_for(lines, 1)
    old_owner = with_backoff(make_core(1, tables, store, projections, outbox, clock))

    async def run() -> tuple[list[Any], list[Any]]:
        projections.down = True
        await old_owner.on_records(records(lines))
        clock.now += 1_000
        await old_owner.flush_due(clock.now)
        assert old_owner.store_failing
        await old_owner.release([0])
        old_owner.forget([0])
        assert not old_owner.store_failing and old_owner.held_flushes() == 0
        projections.down = False
        new_owner = with_backoff(make_core(1, tables, store, projections, outbox, clock))
        await new_owner.restore_assigned([0])
        clock.now += 1_000  # a restored partition flushes within one window
        await new_owner.flush_due(clock.now)
        return await as_replay_files(projections, [7, 8])

    assert asyncio.run(run()) == (expected.projections, expected.badges)
