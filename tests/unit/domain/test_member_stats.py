"""Member statistics as stream aggregates (app/members/stats.py) and the worker's member
directory staging (WorkerCore._member_directory): recalls, @all, duplicates, crash + replay."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.domain.entries import DeleteMessageEntry, Entry, MessageEntry, RecallEntry, decode_record
from app.domain.member_stats import MemberStats
from app.stores.memory_messages import InMemoryMessageStore
from app.stores.memory_projection import InMemoryProjectionStore
from tests.unit.builders import CONV_A, CONV_B, Stream
from tests.unit.test_worker_core import Clock, DictTables, Outbox, make_core, records

ME = 7


def entries(stream: Stream) -> list[Entry]:
    out = []
    for raw in stream.lines:
        decoded = decode_record(raw, 1)
        if isinstance(decoded, MessageEntry | RecallEntry | DeleteMessageEntry):
            out.append(decoded)
    return out


def recall(stream: Stream, user: int, seq: int, sender: int, mention: bool, kind: str = "recall") -> None:
    stream.entry(
        kind,
        user,
        target_conversation_seq=seq,
        target_sender_id=sender,
        target_counts_unread=True,
        target_mention=mention,
    )


def build() -> Stream:
    s = Stream()
    s.message(ME, 1, sender=ME)  # own message
    s.message(ME, 2, sender=ME)
    s.message(ME, 3, sender=99, mention=True)  # @me
    s.message(ME, 4, sender=98, mention=True)  # @all reaches every member as `mention`
    s.message(ME, 5, sender=99)  # neither
    s.message(ME, 6, sender=ME)
    recall(s, ME, 2, sender=ME, mention=False)  # my message recalled
    recall(s, ME, 4, sender=98, mention=True)  # the @all recalled
    recall(s, ME, 6, sender=ME, mention=False, kind="delete_message")  # deleted for everyone
    recall(s, ME, 5, sender=99, mention=False)  # not mine, not mentioning me: ignored
    return s


def test_recalled_and_deleted_messages_stop_counting_and_all_counts_as_a_mention() -> None:
    stats = MemberStats()
    for entry in entries(build()):
        stats.apply(ME, entry)
    assert stats.counts() == (1, 1)  # sent {1,2,6} - gone {2,6}; mentioned {3,4} - gone {4}
    assert list(stats.gone) == [2, 4, 6]  # the irrelevant recall (seq 5) is not kept


def test_a_recall_before_its_message_means_it_never_counts() -> None:
    s = Stream()
    recall(s, ME, 9, sender=ME, mention=False)
    s.message(ME, 9, sender=ME)
    stats = MemberStats()
    changed = [stats.apply(ME, e) for e in entries(s)]
    assert changed == [False, False] and stats.counts() == (0, 0) and not stats.empty


@given(st.randoms(use_true_random=False), st.integers(min_value=1, max_value=3))
def test_duplicates_and_any_repetition_change_nothing(rnd: random.Random, copies: int) -> None:
    """Set semantics: applying a shuffled multiset of the entries (each seen 1..3 times) in
    any order gives the same counts as applying each once in order."""
    once = MemberStats()
    for entry in entries(build()):
        once.apply(ME, entry)
    repeated = [e for e in entries(build()) for _ in range(rnd.randint(1, copies))]
    rnd.shuffle(repeated)
    again = MemberStats()
    for entry in repeated:
        again.apply(ME, entry)
    assert again.counts() == once.counts()


def test_dump_load_round_trip() -> None:
    stats = MemberStats()
    for entry in entries(build()):
        stats.apply(ME, entry)
    loaded = MemberStats.load(stats.dump())
    assert loaded.counts() == stats.counts() and list(loaded.gone) == list(stats.gone)


# -- the worker --------------------------------------------------------------------------------


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


def worker(tables: DictTables, writer: RecordingWriter) -> Any:
    core = make_core(1, tables, InMemoryMessageStore(), InMemoryProjectionStore(), Outbox(), Clock())
    core.state_writer = writer
    return core


async def test_worker_stages_member_rows_from_join_and_leave() -> None:
    s = Stream()
    s.entry("join", ME, CONV_A, joined_at_conversation_seq=3, role="admin")
    s.entry("join", 8, CONV_A, joined_at_conversation_seq=4)
    s.entry("join", ME, CONV_B, joined_at_conversation_seq=1)
    s.entry("leave", 8, CONV_A, left_at_conversation_seq=9, reason="removed")
    writer = RecordingWriter()
    await worker(DictTables(), writer).on_records(records(s.close()))
    assert writer.members == {
        (CONV_A, ME): ("admin", "active", 3, None),
        (CONV_A, 8): ("member", "removed", 4, 9),
        (CONV_B, ME): ("member", "active", 1, None),
    }


async def test_worker_statistics_survive_a_crash_and_a_replay_does_not_double_count() -> None:
    s = build()
    lines = s.close()
    tables = DictTables()
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
    s = Stream()
    s.message(ME, 1, sender=99)  # a message of someone else, not mentioning me
    s.message(ME, 2, sender=99)
    writer = RecordingWriter()
    core = worker(DictTables(), writer)
    await core.on_records(records(s.close()))
    assert writer.stats_stages == 0 and not core.partition(0).processor.member_stats
