"""The worker's member directory staging (app/worker/core.py, from the processor's mirror
changes): group_members rows from joins and leaves, member statistics staged only when a count
moves, statistics surviving a crash without a replay counting twice."""

from __future__ import annotations

from typing import Any

from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from app.stores.memory_tables import MemoryTables
from tests.support.builders import CONV_A, CONV_B, StreamBuilder, member_stats_stream
from tests.support.clock import ManualClock
from tests.support.worker import RecordingOutbox, make_core, records

ME = 7


class RecordingWriter:
    """StateWriter that keeps what was staged (last write per key, as the real one)."""

    def __init__(self) -> None:
        self.state: dict[tuple[int, str], dict[str, Any]] = {}
        self.members: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.member_stats: dict[tuple[str, int], tuple[int, int, int]] = {}
        self.stats_stages = 0

    def stage(self, user_id: int, conversation_id: str, fields: dict[str, object]) -> None:
        self.state.setdefault((user_id, conversation_id), {}).update(fields)

    def stage_member(
        self,
        conversation_id: str,
        user_id: int,
        role: str | None,
        state: str,
        joined_at: int | None,
        left_at: int | None,
    ) -> None:
        self.members[(conversation_id, user_id)] = (role, state, joined_at, left_at)

    def stage_member_stats(
        self, conversation_id: str, user_id: int, record_count: int, mention_count: int, mailbox_seq: int
    ) -> None:
        self.stats_stages += 1
        previous = self.member_stats.get((conversation_id, user_id))
        if previous is None or previous[2] <= mailbox_seq:  # USING TIMESTAMP mailbox_seq
            self.member_stats[(conversation_id, user_id)] = (record_count, mention_count, mailbox_seq)

    async def flush(self) -> int:
        return 0  # every flush succeeds: nothing is ever owed

    def owed(self) -> dict[tuple[int, str], dict[str, Any]]:
        return {}

    def restage(self, user_id: int, conversation_id: str, owed: Any) -> None:
        raise AssertionError("nothing was owed")

    def drop(self, keys: Any) -> None:
        raise AssertionError("nothing was owed")


def worker(tables: MemoryTables, writer: RecordingWriter) -> Any:
    core = make_core(
        1, tables, InMemoryMessageStore(), InMemoryProjectionStore(), RecordingOutbox(), ManualClock()
    )
    core.state_writer = writer
    return core


async def test_worker_stages_member_rows_from_join_and_leave() -> None:
    s = StreamBuilder()
    s.entry("join", ME, CONV_A, joined_at_conversation_seq=3, role="admin")
    s.entry("join", 8, CONV_A, joined_at_conversation_seq=4)
    s.entry("join", ME, CONV_B, joined_at_conversation_seq=1)
    s.entry("leave", 8, CONV_A, left_at_conversation_seq=9, reason="removed")
    writer = RecordingWriter()
    await worker(MemoryTables(), writer).on_records(records(s.close()))
    assert writer.members == {
        (CONV_A, ME): ("admin", "active", 3, None),
        (CONV_A, 8): ("member", "removed", 4, 9),
        (CONV_B, ME): ("member", "active", 1, None),
    }


async def test_worker_statistics_survive_a_crash_and_a_replay_does_not_double_count() -> None:
    s = member_stats_stream(ME)
    lines = s.close()
    tables = MemoryTables()
    writer = RecordingWriter()
    first = worker(tables, writer)
    half = len(lines) // 2
    await first.on_records(records(lines[:half]))
    await first.flush_all()  # its window closed: the hot state is in the changelog tables
    # Crash: a new core restores from the changelog tables, then the whole log is replayed
    # (the first half again: duplicates by mailbox_seq, and the bitmaps would absorb them anyway).
    second = worker(tables, writer)
    await second.on_records(records(lines))
    await second.flush_all()
    assert writer.member_stats[(CONV_A, ME)][:2] == (1, 1)
    restored = second.partition(0).processor.member_stats[(ME, CONV_A)]
    assert restored.counts() == (1, 1)
    # A third core from the tables alone has the same bitmaps (they live in the row record).
    third = worker(tables, RecordingWriter())
    assert third.partition(0).processor.member_stats[(ME, CONV_A)].counts() == (1, 1)


async def test_worker_stages_statistics_only_when_a_count_moves() -> None:
    s = StreamBuilder()
    s.message(ME, 1, sender=99)  # a message of someone else, not mentioning me
    s.message(ME, 2, sender=99)
    writer = RecordingWriter()
    core = worker(MemoryTables(), writer)
    await core.on_records(records(s.close()))
    assert writer.stats_stages == 0 and not core.partition(0).processor.member_stats
