"""Rows rebuilt from UserConversationState + MessageStore equal the replayed rows on every field
state can know (DESIGN §6)."""

from __future__ import annotations

from typing import Any

from app.domain.rebuild import Head, row_from_state
from app.replay import Replayer, ReplayOptions
from tests.unit.builders import CONV_A, CONV_B, Stream

ME = 7


def state_of(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "membership": row["membership"],
        "joined_at_conversation_seq": row["joined_at_conversation_seq"],
        "left_at_conversation_seq": row["left_at_conversation_seq"],
        "read_conversation_seq": row["read_conversation_seq"],
        "hidden_before_conversation_seq": row["hidden_before_conversation_seq"],
        "deleted_before_conversation_seq": row["deleted_before_conversation_seq"],
        "pin_rank": row["pin_rank"],
        "archived": row["archived"],
        "muted": row["muted"],
    }


def rebuilt_equals_replayed(stream: Stream, head_of: dict[str, int]) -> None:
    replayer = Replayer(ReplayOptions(), lambda frame: None)
    replayer.feed_many(stream.close())
    result = replayer.finish()
    for row in result.projections:
        cid = row["conversation_id"]
        stored = replayer.store.get(cid, head_of[cid])
        assert stored is not None
        head = Head(stored.conversation_seq, stored.message_id, stored.activity_id)
        rebuilt = row_from_state(row["user_id"], cid, state_of(row), head, replayer.store).as_row()
        unknowable = {"projection_mailbox_seq"}
        assert {k: v for k, v in rebuilt.items() if k not in unknowable} == {
            k: v for k, v in row.items() if k not in unknowable
        }


def test_cleared_deleted_pinned_and_read_rows_come_back() -> None:
    s = Stream()
    for seq in range(1, 8):
        s.message(ME, seq, conv=CONV_A, mention=seq == 6)
        s.message(ME, seq, conv=CONV_B, sender=ME if seq == 3 else 99)
    s.read(ME, 4, conv=CONV_A)
    s.recall(ME, 5, conv=CONV_A)
    s.entry("pin", ME, CONV_A, pin_rank=3)
    s.entry("delete_conversation", ME, CONV_B, deleted_before_conversation_seq=7)
    rebuilt_equals_replayed(s, {CONV_A: 7, CONV_B: 7})


def test_a_former_member_is_frozen_at_left_at() -> None:
    s = Stream()
    for seq in range(1, 6):
        s.message(ME, seq, sender=5)
        s.message(99, seq, sender=5)  # another member keeps receiving after ME left
    s.entry("leave", ME, CONV_A, left_at_conversation_seq=3, reason="left")
    for seq in range(6, 9):
        s.message(99, seq, sender=5)
    rebuilt_equals_replayed(s, {CONV_A: 8})
