"""The worker core (no faust): batches of raw records through the same core as replay, state in
the in-memory tables, projections in the in-memory projection store. Its final projection must be
replay's, whatever the batching, the flush timing, or a crash between batches."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import msgspec
import orjson
from hypothesis import given
from hypothesis import strategies as st

from app.domain.projector import ProjectorConfig
from app.replay import ReplayOptions, run_replay
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from app.worker.core import WorkerConfig, WorkerCore
from app.worker.ports import RawRecord, raw_record
from tests.support.builders import CONV_A, CONV_B, StreamBuilder
from tests.support.clock import ManualClock
from tests.support.mirror_writer import MirrorCassandra, MirrorWriter
from tests.support.projection_files import as_replay_files
from tests.support.strategies import Stream, scenarios, streams
from tests.support.worker import (
    WHOLE_STREAMS,
    RecordingOutbox,
    StreamRig,
    batches,
    core_with_writer,
    make_core,
    message_store_for,
    pin_batch,
    records,
)


async def feed(
    core: WorkerCore, batch_list: list[list[RawRecord]], clock: ManualClock, rnd: random.Random
) -> None:
    for batch in batch_list:
        await core.on_records(batch)
        clock.now += rnd.choice((0, 10, 60, 150))
        await core.flush_due(clock.now)


@WHOLE_STREAMS
@given(
    stream=st.one_of(streams(), streams(scenarios(min_steps=30, max_steps=120))),
    seed=st.integers(0, 2**32 - 1),
    crash=st.booleans(),
    hot_rows=st.sampled_from([500_000, 500_000, 1, 3]),
    hot_bytes=st.sampled_from([None, None, 3000]),
)
def test_worker_projection_equals_replay(
    stream: Stream, seed: int, crash: bool, hot_rows: int, hot_bytes: int | None
) -> None:
    """Whatever the batching, the flush timing, a crash between batches — and a hot set of a
    handful of rows, or of a few rows' bytes (member statistics counted), so that every persist
    evicts and every batch reads the state back."""
    rig = StreamRig(stream, seed, hot_rows, hot_bytes)
    rnd, clock, recs = rig.rnd, rig.clock, rig.records
    expected, projections, outbox = rig.expected, rig.projections, rig.outbox

    async def run() -> None:
        core = rig.new_core()
        parts = batches(recs, rnd)
        if crash and parts:
            cut = rnd.randrange(len(parts))
            await feed(core, parts[:cut], clock, rnd)
            # SIGKILL: memory (hot state, dirty set) is gone; the tables and both stores survive.
            # Offsets were committed at most up to the durable offset (the last persist); re-read
            # from there, or from a few records earlier (an older commit).
            crashed = core.partitions.get(0)
            core = rig.new_core()
            again = rig.reread_from(crashed.durable_offset if crashed is not None else None)
            await feed(core, batches(again, rnd), clock, rnd)
        else:
            await feed(core, parts, clock, rnd)
        await core.flush_all()

    asyncio.run(run())
    rows, badges = asyncio.run(as_replay_files(projections, [b["user_id"] for b in expected.badges]))
    assert rows == expected.projections
    assert badges == expected.badges
    assert len(outbox.letters) >= expected.stats["dead_letters"] > 0 or expected.stats["dead_letters"] == 0
    # Every frame chain a client sees is gap-free unless the store refused a replayed version.
    last: dict[tuple[int, str], int] = {}
    for frame in outbox.frames_out:
        key = (frame["user_id"], frame["type"])
        assert frame["projection_mailbox_seq"] > last.get(key, 0)
        last[key] = frame["projection_mailbox_seq"]


def test_dead_letters_carry_reason_and_origin() -> None:
    s = StreamBuilder()
    s.message(7, 1)
    lines = [b"{oops", *s.close()]
    tables, projections, outbox, clock = (
        MemoryTables(),
        InMemoryProjectionStore(),
        RecordingOutbox(),
        ManualClock(),
    )
    core = make_core(1, tables, InMemoryMessageStore(), projections, outbox, clock)
    asyncio.run(core.on_records(records(lines)))
    (letter,) = outbox.letters
    assert letter["topic"] == "mailbox-tail" and letter["partition"] == 0 and letter["offset"] == 0
    assert letter["value"] == "{oops" and "malformed" in letter["reason"].lower()
    assert core.stats.dead_letters == 1 and core.stats.applied == 1


def test_a_null_or_empty_value_is_a_dead_letter_with_its_reason() -> None:
    s = StreamBuilder()
    s.message(7, 1)
    tables, projections, outbox, clock = (
        MemoryTables(),
        InMemoryProjectionStore(),
        RecordingOutbox(),
        ManualClock(),
    )
    core = make_core(1, tables, InMemoryMessageStore(), projections, outbox, clock)
    tombstone = raw_record("mailbox-tail", 0, 0, b"7", None)
    empty = RawRecord("mailbox-tail", 0, 1, b"7", b"")
    good = [record._replace(offset=record.offset + 2) for record in records(s.close())]
    asyncio.run(core.on_records([tombstone, empty, *good]))
    assert [(letter["offset"], letter["value"]) for letter in outbox.letters] == [(0, ""), (1, "")]
    assert all("empty record" in letter["reason"] for letter in outbox.letters)
    assert core.stats.dead_letters == 2 and core.stats.applied == 1


def test_pending_entries_survive_a_crash_in_the_tables() -> None:
    s = StreamBuilder(lanes=2)
    s.message(7, 1, lane=1)
    s.marker(0, 1)  # lane 1 has not reported: the entry waits
    tables, projections, outbox, clock = (
        MemoryTables(),
        InMemoryProjectionStore(),
        RecordingOutbox(),
        ManualClock(),
    )
    store = InMemoryMessageStore()
    core = make_core(2, tables, store, projections, outbox, clock)
    asyncio.run(core.on_records(records(s.lines)))
    assert tables.count(0, "pending") == 0  # hot state: persisted at the window's end, not per batch
    clock.now += 100
    asyncio.run(core.flush_due(clock.now))
    assert tables.count(0, "pending") == 1 and core.stats.applied == 0
    assert core.durable_offsets() == {0: len(s.lines)}
    restarted = make_core(2, tables, store, projections, outbox, clock)
    asyncio.run(restarted.restore_assigned([0]))
    marker = b'{"type":"watermark","lane":1,"watermark":1,"ts":5}'
    late = RawRecord("mailbox-tail", 0, len(s.lines), None, marker)
    asyncio.run(restarted.on_records([late]))
    asyncio.run(restarted.flush_all())
    assert tables.count(0, "pending") == 0
    stored = asyncio.run(projections.load(7))
    assert stored.rows[CONV_A]["unread_count"] == 1


class RecordingWriter:
    """A StateWriter that records what is staged and can fail its flushes."""

    def __init__(self, fail: bool = False) -> None:
        self.staged: list[dict[str, object]] = []
        self.fail = fail
        self.unwritten: dict[tuple[int, str], dict[str, Any]] = {}

    def stage(self, user_id: int, conversation_id: str, fields: dict[str, object]) -> None:
        self.staged.append(dict(fields))
        self.unwritten.setdefault((user_id, conversation_id), {"state": {}})["state"].update(fields)

    def owed(self) -> dict[tuple[int, str], dict[str, Any]]:
        return dict(self.unwritten)

    def restage(self, user_id: int, conversation_id: str, owed: Any) -> None:
        self.unwritten[(user_id, conversation_id)] = owed

    def drop(self, keys: Any) -> None:
        for key in keys:
            self.unwritten.pop(key, None)

    def stage_member(self, *args: object) -> None:
        pass

    def stage_member_stats(self, *args: object) -> None:
        pass

    async def flush(self) -> int:
        if self.fail:
            raise RuntimeError("cassandra down")
        self.unwritten.clear()
        return len(self.staged)


def test_values_cassandra_cannot_hold_are_not_mirrored_and_a_failing_mirror_never_stops_the_worker() -> None:
    lines = [
        orjson.dumps(
            {
                "type": "pin",
                "mailbox_seq": 2**60,
                "lane": 0,
                "ts": 5,
                "event_id": "e",
                "user_id": 7,
                "conversation_id": CONV_A,
                "pin_rank": 1,
            }
        ),
        orjson.dumps(
            {
                "type": "unpin",
                "mailbox_seq": 2**63 + 5,
                "lane": 0,
                "ts": 6,
                "event_id": "e",
                "user_id": 7,
                "conversation_id": CONV_A,
            }
        ),
        orjson.dumps({"type": "watermark", "lane": 0, "watermark": 2**64 - 1, "ts": 7}),
    ]
    writer = RecordingWriter(fail=True)
    tables, projections, outbox, clock = (
        MemoryTables(),
        InMemoryProjectionStore(),
        RecordingOutbox(),
        ManualClock(),
    )
    config = WorkerConfig(
        lanes=1,
        projector=ProjectorConfig(window_ms=100, max_dirty_rows=100_000, unread_precise_limit=200),
    )
    core = core_with_writer(config, tables, writer, outbox=outbox, projections=projections, clock=clock)

    async def run() -> None:
        await core.on_records(records(lines))
        while not core.stats.state_write_failures:  # the round the batch started
            await asyncio.sleep(0.01)
        await core.flush_all()

    asyncio.run(run())
    (first,) = writer.staged  # the second entry's seq does not fit a CQL bigint
    assert "first_seen_mailbox_seq" not in first  # beyond the cell-timestamp scheme's range
    # Tried after the batch, then again by the clean stop's drain: counted, never raised, and
    # what is owed is in the row's changelog record.
    assert core.stats.state_unmirrorable == 1 and core.stats.state_write_failures == 2
    record = msgspec.msgpack.decode(tables.get_rows(0, [(7, CONV_A)])[(7, CONV_A)])
    assert "pin_rank" in record["mirror_owed"]["state"]
    assert core.stats.applied == 2
    stored = asyncio.run(projections.load(7))
    assert stored.rows[CONV_A]["pinned"] is False and stored.projection_mailbox_seq == 2**63 + 5


class GatedWriter(RecordingWriter):
    """A StateWriter whose rounds wait for a gate (Cassandra slower than the batches). Like the
    real writer, a round takes what is staged when it starts, and that share stays owed until
    the round is acknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.rounds = 0
        self.written = 0
        self.in_flight: dict[tuple[int, str], dict[str, Any]] = {}

    def owed(self) -> dict[tuple[int, str], dict[str, Any]]:
        owed = {key: {"state": dict(value["state"])} for key, value in self.in_flight.items()}
        for key, value in self.unwritten.items():
            owed.setdefault(key, {"state": {}})["state"].update(value["state"])
        return owed

    async def flush(self) -> int:
        self.rounds += 1
        taken, self.unwritten = self.unwritten, {}
        self.in_flight = taken
        await self.gate.wait()
        self.in_flight = {}
        self.written += len(taken)
        return len(taken)


def test_a_slow_mirror_holds_batches_back_only_past_its_backlog_bound_and_never_holds_a_flush() -> None:
    writer = GatedWriter()
    config = WorkerConfig(
        lanes=1,
        projector=ProjectorConfig(window_ms=100_000, max_dirty_rows=100_000, unread_precise_limit=200),
        mirror_spacing_ms=0,
    )
    tables = MemoryTables()
    core = core_with_writer(config, tables, writer)
    assert core.mirror is not None
    core.mirror.backlog_rows = 3

    async def run() -> None:
        # The first batch starts a mirror round, which Cassandra holds; the next batches are
        # applied meanwhile without waiting for it, up to the backlog bound.
        for offset in range(4):
            await asyncio.wait_for(core.on_records(pin_batch(offset)), 10)
        assert writer.rounds == 1 and writer.written == 0 and core.stats.applied == 4
        # One more and the backlog is past its bound: this batch waits for the mirror.
        held = asyncio.ensure_future(core.on_records(pin_batch(4)))
        for _ in range(50):
            await asyncio.sleep(0)
        assert not held.done()
        writer.gate.set()
        await asyncio.wait_for(held, 10)
        # Round 1 wrote the first pin; the drain the four staged while it waited, merged: one key.
        assert writer.rounds == 2 and len(writer.staged) == 5 and writer.written == 2

        # A flush (and its persist) never waits for Cassandra: the rows' records carry what the
        # round in flight and the staging still owe, and the offsets become durable at once.
        writer.gate.clear()
        await core.on_records(pin_batch(5))
        for _ in range(5):
            await asyncio.sleep(0)
        assert writer.in_flight  # a round holds pin 6's state
        await core.on_records(pin_batch(6))  # pin 7 staged behind it
        await asyncio.wait_for(core.flush_partition(core.partition(0)), 10)
        assert core.durable_offsets() == {0: 14}
        record = msgspec.msgpack.decode(tables.get_rows(0, [(7, CONV_A)])[(7, CONV_A)])
        assert record["mirror_owed"]["state"]["pin_rank"] == 7

    asyncio.run(run())

    # The worker dies with the round unacknowledged: the restart stages the owed writes again.
    rewriter = RecordingWriter()
    restarted = core_with_writer(config, tables, rewriter)
    asyncio.run(restarted.restore_assigned([0]))
    assert rewriter.unwritten[(7, CONV_A)]["state"]["pin_rank"] == 7
    assert restarted.stats.state_restaged_rows == 1


@WHOLE_STREAMS
@given(
    stream=st.one_of(streams(), streams(scenarios(min_steps=30, max_steps=120))),
    seed=st.integers(0, 2**32 - 1),
)
def test_cassandra_writes_owed_at_a_crash_are_written_after_the_restart(stream: Stream, seed: int) -> None:
    """Cassandra fails now and then, and the worker is killed at a random point: once it runs
    again with Cassandra up, UserConversationState, group_members and member_stats hold what a
    worker whose Cassandra never failed wrote (a write owed at a persist travels in the row's
    changelog record; the entries behind it are re-read as duplicates and never staged again)."""
    lines = [line for line in stream.lines() if line.strip()]
    rnd = random.Random(seed)
    store = message_store_for(lines, stream.lanes)
    recs = records(lines)
    parts = batches(recs, rnd)

    def core_over(tables: MemoryTables, writer: MirrorWriter) -> WorkerCore:
        core = make_core(
            stream.lanes, tables, store, InMemoryProjectionStore(), RecordingOutbox(), ManualClock()
        )
        core.state_writer = writer
        return core

    async def never_failing() -> MirrorCassandra:
        cassandra = MirrorCassandra()
        core = core_over(MemoryTables(), MirrorWriter(cassandra))
        await feed(core, parts, core.clock, random.Random(seed))  # type: ignore[arg-type]
        await core.flush_all()
        return cassandra

    async def failing_then_killed() -> tuple[MirrorCassandra, int]:
        cassandra = MirrorCassandra()
        tables = MemoryTables()
        writer = MirrorWriter(cassandra)
        core = core_over(tables, writer)
        clock = core.clock
        cut = rnd.randrange(len(parts) + 1)
        for batch in parts[:cut]:
            writer.down = rnd.random() < 0.6
            await core.on_records(batch)
            clock.now += rnd.choice((0, 60, 150))  # type: ignore[attr-defined]
            await core.flush_due(clock.now)  # type: ignore[attr-defined]
        if rnd.random() < 0.5:
            writer.down = True
            await core.flush_all()  # killed right after a persist whose mirror failed
        crashed = core.partitions.get(0)
        durable = (crashed.durable_offset if crashed is not None else None) or 0
        # SIGKILL: the writer's staging and the hot state are gone; tables and Cassandra stay.
        if core.mirror is not None:
            await core.mirror.close()  # its rounds die with it
        restarted = core_over(tables, MirrorWriter(cassandra))
        await restarted.restore_assigned([0])  # on assignment, as the worker does
        again = recs[max(0, durable - rnd.randint(0, 5)) :]
        await feed(restarted, batches(again, rnd), restarted.clock, rnd)  # type: ignore[arg-type]
        await restarted.flush_all()
        return cassandra, writer.failures

    expected = asyncio.run(never_failing())
    got, _ = asyncio.run(failing_then_killed())
    assert got == expected


def test_a_partition_handed_over_takes_its_owed_cassandra_writes_along() -> None:
    """Worker A persists rows owing Cassandra writes and hands the partition over; worker B
    restages and writes them, then newer ones. A's writer must not write them late (state
    columns are last-write-wins: B's newer values would be overwritten)."""
    s = StreamBuilder()
    s.message(7, 1)
    s.message(7, 2)
    first = s.close_part()
    s.read(7, 2)
    second = s.close()
    cassandra = MirrorCassandra()
    store = message_store_for([*first, *second], 1)
    tables = MemoryTables()
    writer_a, writer_b = MirrorWriter(cassandra), MirrorWriter(cassandra)
    worker_a = make_core(1, tables, store, InMemoryProjectionStore(), RecordingOutbox(), ManualClock())
    worker_a.state_writer = writer_a
    worker_b = make_core(1, tables, store, InMemoryProjectionStore(), RecordingOutbox(), ManualClock())
    worker_b.state_writer = writer_b

    async def run() -> None:
        writer_a.down = True
        await worker_a.on_records(records(first))
        await worker_a.release([0])
        worker_a.forget([0])
        assert writer_a.owed() == {}  # handed over with the records
        await worker_b.restore_assigned([0])
        offset = len(first)
        await worker_b.on_records(
            [RawRecord("mailbox-tail", 0, offset + i, b"k", raw) for i, raw in enumerate(second)]
        )
        await worker_b.flush_all()
        writer_a.down = False
        assert await writer_a.flush() == 0

    asyncio.run(run())
    assert cassandra.state[(7, CONV_A)]["read_conversation_seq"] == 2
    assert worker_b.stats.state_restaged_rows == 1


class _OwnershipTables(MemoryTables):
    """Records the commits and the hand-overs, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int]] = []

    def hand_over(self, partition: int) -> None:
        self.events.append(("hand_over", partition))

    async def commit(self) -> None:
        await super().commit()
        self.events.append(("commit", -1))


def test_a_partition_is_handed_over_after_its_last_persist_and_a_dropped_one_without_any() -> None:
    """While the worker writes a partition, the local store takes no changelog record older
    than its own commits (tables/state.WorkerTable); that ends once the hand-over's persist is
    committed, never before it. A partition dropped (held but not assigned) persists nothing."""
    s = StreamBuilder()
    s.message(7, 1)
    s.read(7, 1)
    tables = _OwnershipTables()
    core = make_core(
        1, tables, InMemoryMessageStore(), InMemoryProjectionStore(), RecordingOutbox(), ManualClock()
    )

    async def run() -> None:
        await core.restore_assigned([0])
        await core.on_records(records(s.close()))
        await core.release([0])
        core.forget([0])
        await core.release([0])  # revoked again: nothing more to hand over
        await core.restore_assigned([1])
        commits = tables.events.count(("commit", -1))
        core.drop([1])
        assert tables.events.count(("commit", -1)) == commits
        assert 1 not in core.partitions

    asyncio.run(run())
    handed = [event for event in tables.events if event[0] == "hand_over"]
    assert handed == [("hand_over", 0), ("hand_over", 1)]
    first = tables.events.index(("hand_over", 0))
    assert tables.events[first - 1] == ("commit", -1)


def test_an_unreadable_owed_record_is_logged_and_the_partition_still_restores() -> None:
    s = StreamBuilder()
    s.message(7, 1)
    tables, store = MemoryTables(), InMemoryMessageStore()
    down = MirrorWriter(MirrorCassandra())
    down.down = True
    core = make_core(1, tables, store, InMemoryProjectionStore(), RecordingOutbox(), ManualClock())
    core.state_writer = down
    asyncio.run(core.on_records(records(s.close())))
    asyncio.run(core.flush_all())
    rows = tables.data[0]["rows"]
    (key,) = rows
    record = msgspec.msgpack.decode(rows[key])
    assert set(record["mirror_owed"]) == {"state"}
    record["mirror_owed"] = [1, 2]  # not what this version writes
    rows[key] = msgspec.msgpack.encode(record)
    restarted = make_core(1, tables, store, InMemoryProjectionStore(), RecordingOutbox(), ManualClock())
    restarted.state_writer = MirrorWriter(MirrorCassandra())
    asyncio.run(restarted.restore_assigned([0]))
    assert restarted.stats.state_restaged_rows == 0
    assert restarted.partitions[0].processor.users[7].rows[CONV_A].unread_count == 1


class _Crash(Exception):
    pass


class _CrashingStore(InMemoryProjectionStore):
    """A projection store whose writes fail while `down`: the process dies between the persist
    that precedes a flush's store write and the write itself."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def write(self, batches: Any) -> Any:
        if self.down:
            raise _Crash
        return await super().write(batches)


def test_a_kill_between_the_persist_and_the_store_write_loses_no_row() -> None:
    """Durable before visible: the persist that precedes a flush's store write must not record
    the flush as done. Killed right there, the restarted worker flushes the user again (the
    store had not seen those rows); before the fix the user's record said flushed, nothing was
    written again and the store kept the older rows for good."""
    s = StreamBuilder()
    s.message(7, 1, conv=CONV_A)
    s.message(7, 1, conv=CONV_B)
    lines = s.close()
    expected = run_replay(lines, ReplayOptions())
    store = message_store_for(lines, 1)
    tables, projections, outbox, clock = MemoryTables(), _CrashingStore(), RecordingOutbox(), ManualClock()

    async def run() -> tuple[list[Any], list[Any]]:
        core = make_core(1, tables, store, projections, outbox, clock)
        await core.on_records(records(lines))
        projections.down = True
        with contextlib.suppress(_Crash):
            await core.flush_all()  # persisted, then the write fails: the process is gone
        projections.down = False
        restarted = make_core(1, tables, store, projections, outbox, clock)
        await restarted.restore_assigned([0])
        clock.now += 10_000  # the restored partition flushes within one window
        await restarted.flush_due(clock.now)
        return await as_replay_files(projections, [7])

    rows, badges = asyncio.run(run())
    assert rows == expected.projections
    assert badges == expected.badges


def test_work_no_flush_carried_survives_two_crashes_in_a_row() -> None:
    """A restored partition reads only the users its checkpoint lists as having work no flush
    carried. That list must survive the restored worker's own persists until those users are
    flushed: killed again before the flush, the next restart must still find them."""
    s = StreamBuilder()
    s.message(7, 1, conv=CONV_A)
    first = s.close_part()
    s.message(8, 2, conv=CONV_B)
    second = s.close()
    lines = [*first, *second]
    expected = run_replay(lines, ReplayOptions())
    store = message_store_for(lines, 1)
    tables, projections, outbox, clock = (
        MemoryTables(),
        InMemoryProjectionStore(),
        RecordingOutbox(),
        ManualClock(),
    )

    async def run() -> tuple[list[Any], list[Any]]:
        core = make_core(1, tables, store, projections, outbox, clock, window_ms=100_000)
        await core.on_records(records(first))
        await core.persist(core.partitions[0])  # persisted, never flushed: killed here
        again = make_core(1, tables, store, projections, outbox, clock, window_ms=100_000)
        await again.restore_assigned([0])
        await again.on_records(records(second, len(first)))  # user 8 only
        await again.persist(again.partitions[0])  # killed again before any flush
        last = make_core(1, tables, store, projections, outbox, clock, window_ms=100)
        await last.restore_assigned([0])
        clock.now += 10_000
        await last.flush_due(clock.now)
        return await as_replay_files(projections, [7, 8])

    rows, badges = asyncio.run(run())
    assert rows == expected.projections
    assert badges == expected.badges


def test_a_hot_set_of_two_rows_reads_the_state_back_and_ends_as_replay() -> None:
    """Six rows, at most two in memory: every persist evicts, batches read users and rows back
    from the tables (one multi-get each), badges are recomputed over rows read back; the outcome
    is replay's."""
    s = StreamBuilder()
    seq = 0
    for _ in range(4):
        for user in (7, 8, 9):
            for conv in (CONV_A, CONV_B):
                seq += 1
                s.message(user, seq, conv=conv, mention=seq % 5 == 0)
        s.marker(0)  # the lane reports: these entries apply now
        s.read(7, seq - 2, conv=CONV_A)
    lines = s.close()
    expected = run_replay(lines, ReplayOptions())
    store = message_store_for(lines, 1)
    tables, projections, outbox, clock = (
        MemoryTables(),
        InMemoryProjectionStore(),
        RecordingOutbox(),
        ManualClock(),
    )
    core = make_core(1, tables, store, projections, outbox, clock, hot_rows=2)

    async def run() -> int:
        most = 0
        for start in range(0, len(lines), 3):
            await core.on_records(records(lines[start : start + 3], start))
            clock.now += 150
            await core.flush_due(clock.now)
            most = max(most, core.partitions[0].processor.resident_rows)
        await core.flush_all()
        return most

    asyncio.run(run())
    processor = core.partitions[0].processor
    assert processor.residency is not None and processor.residency.reads > 0
    assert processor.resident_rows <= 2
    rows, badges = asyncio.run(as_replay_files(projections, [7, 8, 9]))
    assert rows == expected.projections
    assert badges == expected.badges


class _CountingTables(MemoryTables):
    def __init__(self) -> None:
        super().__init__()
        self.commits = 0

    async def commit(self) -> None:
        self.commits += 1
        await super().commit()


class _GatedStore(InMemoryProjectionStore):
    """A projection store whose next write waits until `opened` is set (a flush mid-write)."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = asyncio.Event()
        self.opened = asyncio.Event()

    async def write(self, batches: Any) -> Any:
        self.writing.set()
        await self.opened.wait()
        return await super().write(batches)


def test_a_batch_applied_while_a_flush_is_written_adds_no_persist_and_ends_as_replay() -> None:
    """A batch applied while the flush scheduler writes the window's flush sees that flush queued
    and waits to publish; by then it is published. The batch made nothing publishable, so it
    persists nothing (a changelog round trip per such batch, ~40% of the persists at a 100 ms
    window); its entries go durable, and out, with the next window's persist and flush."""
    s = StreamBuilder()
    s.message(7, 1, conv=CONV_A)
    first = s.close_part()
    s.message(8, 2, conv=CONV_B)
    second = s.close()
    expected = run_replay([*first, *second], ReplayOptions())
    store = message_store_for([*first, *second], 1)
    tables, projections, outbox, clock = _CountingTables(), _GatedStore(), RecordingOutbox(), ManualClock()

    async def run() -> tuple[list[Any], list[Any]]:
        core = make_core(1, tables, store, projections, outbox, clock)
        await core.on_records(records(first))
        clock.now += 200
        flushing = asyncio.create_task(core.flush_due(clock.now))
        await projections.writing.wait()  # persisted, the store write under way
        persists = tables.commits
        batch = asyncio.create_task(core.on_records(records(second, len(first))))
        await asyncio.sleep(0)  # the batch is applied and waits for the flush lock
        projections.opened.set()
        await flushing
        await batch
        assert tables.commits == persists, "the batch's publish persisted with nothing to publish"
        assert not core.partitions[0].unpublished
        assert core.durable_offsets() == {0: len(first)}  # the batch: durable with the next persist
        clock.now += 200
        await core.flush_due(clock.now)
        assert core.durable_offsets() == {0: len(first) + len(second)}
        return await as_replay_files(projections, [7, 8])

    rows, badges = asyncio.run(run())
    assert rows == expected.projections
    assert badges == expected.badges
