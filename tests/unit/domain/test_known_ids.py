"""The validated-id caches of app/domain/entries.py stay bounded however many distinct ids a log
names (issue 33 item 4: `projector replay --state-dir` grew with every new conversation)."""

from __future__ import annotations

import orjson

from app.domain import entries
from app.domain.decoding import decode_chunk
from app.domain.entries import JoinEntry, decode_record, known_activities, known_conversations

# What the caches may hold at most, whatever the log: a small constant next to the hot set.
BOUND = 1 << 16


def _conversation(index: int) -> str:
    return f"{index:08x}-0000-4000-8000-000000000000"


def _join(seq: int, index: int) -> bytes:
    return orjson.dumps(
        {
            "type": "join",
            "mailbox_seq": seq,
            "lane": 0,
            "ts": 1_767_225_600_000 + seq,
            "event_id": f"e{seq}",
            "user_id": 7,
            "conversation_id": _conversation(index),
            "joined_at_conversation_seq": 0,
        }
    )


def test_the_conversations_cache_stays_bounded_over_many_distinct_conversations() -> None:
    assert entries._KNOWN_CONVERSATIONS_MAX <= BOUND
    assert entries._KNOWN_ACTIVITIES_MAX <= BOUND
    raws = [_join(seq, seq) for seq in range(1, BOUND + 5_001)]
    for start in range(0, len(raws), 4096):
        decoded, stops = decode_chunk(raws[start : start + 4096], 1)
        assert stops == []
        assert all(type(record) is JoinEntry for record in decoded)
        assert len(known_conversations) <= BOUND
    assert len(known_activities) <= BOUND


def test_an_id_that_left_the_cache_is_validated_again_with_the_same_result() -> None:
    first = decode_record(_join(1, 1), 1)
    for seq in range(2, BOUND + 3):  # more distinct ids than the cache holds: it is cleared
        decode_record(_join(seq, seq), 1)
    assert decode_record(_join(1, 1), 1) == first
    bad = orjson.loads(_join(9, 9))
    bad["conversation_id"] = "not-a-uuid"
    assert type(decode_record(orjson.dumps(bad), 1)) is not JoinEntry
