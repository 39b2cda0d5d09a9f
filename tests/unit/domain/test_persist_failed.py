"""A persist that did not complete gives its changes back to the processor (`persist_failed`):
the next persist writes them with what changed since, and an entry released in between is
deleted, never written again."""

from __future__ import annotations

import orjson

from app.domain.processor import PartitionProcessor
from app.domain.projector import ProjectorConfig
from app.stores.memory_messages import InMemoryMessageStore

C = "0a0a0a0a-0000-4000-8000-000000000001"
D = "0a0a0a0a-0000-4000-8000-000000000002"


def message(user: int, seq: int, conversation: str = C) -> bytes:
    return orjson.dumps(
        {
            "type": "message", "mailbox_seq": seq, "lane": 0, "ts": 1767225600000 + seq,
            "event_id": f"ev-{seq}", "user_id": user, "conversation_id": conversation,
            "conversation_seq": seq, "message_id": f"m{seq}",
            "activity_id": f"019b76daa800000000000000{seq:08x}", "sender_id": 9,
            "created_at": 1767225600000, "counts_unread": True, "mention": False,
        }
    )  # fmt: skip


def marker(watermark: int) -> bytes:
    return orjson.dumps({"type": "watermark", "lane": 0, "watermark": watermark, "ts": 1767225700000})


def processor() -> PartitionProcessor:
    return PartitionProcessor(ProjectorConfig(), InMemoryMessageStore(), lanes=1, track_changes=True)


def test_the_changes_of_a_failed_persist_join_those_made_since() -> None:
    p = processor()
    p.on_records([marker(1), message(1, 1), message(1, 2)], 1_000)  # 1 applied, 2 waits
    failed = p.changes_since_persist()
    assert failed.rows == {(1, C)} and (1, 2) in failed.pending_added
    p.on_records([marker(2), message(2, 3, D), message(3, 3, D)], 2_000)  # 2 released, 3s wait
    p.on_records([message(3, 1, D)], 2_500)  # at the watermark: applied
    p.persist_failed(failed)
    merged = p.changes_since_persist()
    assert merged.rows == {(1, C), (3, D)}
    assert merged.users == {1, 3}
    assert merged.gate
    # 2 waited at the failed persist (its record may be in the table) and was released since:
    # deleted, not written again. 3 still waits: written.
    assert (1, 2) not in merged.pending_added and (1, 2) in merged.pending_released
    assert set(merged.pending_added) == {(2, 3), (3, 3)}
    assert merged.since == 1_000  # the older change decides when the persist is due


def test_an_entry_still_waiting_is_written_by_the_next_persist() -> None:
    p = processor()
    p.on_records([marker(1), message(1, 2)], 1_000)
    failed = p.changes_since_persist()
    p.persist_failed(failed)
    again = p.changes_since_persist()
    assert set(again.pending_added) == {(1, 2)} and not again.pending_released
