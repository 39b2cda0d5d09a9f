"""Member statistics as stream aggregates (app/domain/member_stats.py): recalls, @all,
duplicates, any order."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from app.domain.entries import DeleteMessageEntry, Entry, MessageEntry, RecallEntry, decode_record
from app.domain.member_stats import MemberStats
from tests.support.builders import StreamBuilder, member_stats_stream

ME = 7


def entries(stream: StreamBuilder) -> list[Entry]:
    out: list[Entry] = []
    for raw in stream.lines:
        decoded = decode_record(raw, 1)
        if isinstance(decoded, MessageEntry | RecallEntry | DeleteMessageEntry):
            out.append(decoded)
    return out


def test_recalled_and_deleted_messages_stop_counting_and_all_counts_as_a_mention() -> None:
    stats = MemberStats()
    for entry in entries(member_stats_stream(ME)):
        stats.apply(ME, entry)
    assert stats.counts() == (1, 1)  # sent {1,2,6} - gone {2,6}; mentioned {3,4} - gone {4}
    assert list(stats.gone) == [2, 4, 6]  # the irrelevant recall (seq 5) is not kept


def test_a_recall_before_its_message_means_it_never_counts() -> None:
    s = StreamBuilder()
    s.recall(ME, 9, sender=ME)
    s.message(ME, 9, sender=ME)
    stats = MemberStats()
    changed = [stats.apply(ME, e) for e in entries(s)]
    assert changed == [False, False] and stats.counts() == (0, 0) and not stats.empty


@given(st.randoms(use_true_random=False), st.integers(min_value=1, max_value=3))
def test_duplicates_and_any_repetition_change_nothing(rnd: random.Random, copies: int) -> None:
    """Set semantics: applying a shuffled multiset of the entries (each seen 1..3 times) in
    any order gives the same counts as applying each once in order."""
    once = MemberStats()
    for entry in entries(member_stats_stream(ME)):
        once.apply(ME, entry)
    repeated = [e for e in entries(member_stats_stream(ME)) for _ in range(rnd.randint(1, copies))]
    rnd.shuffle(repeated)
    again = MemberStats()
    for entry in repeated:
        again.apply(ME, entry)
    assert again.counts() == once.counts()


def test_dump_load_round_trip() -> None:
    stats = MemberStats()
    for entry in entries(member_stats_stream(ME)):
        stats.apply(ME, entry)
    loaded = MemberStats.load(stats.dump())
    assert loaded.counts() == stats.counts() and list(loaded.gone) == list(stats.gone)
