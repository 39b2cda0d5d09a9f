"""Rows rebuilt from UserConversationState + MessageStore equal the replayed rows on every field
state can know (docs/contract.md §6)."""

from __future__ import annotations

from typing import Any

from app.domain.rebuild import Head, row_from_state
from app.replay import Replayer, ReplayOptions
from tests.support.builders import CONV_A, CONV_B, StreamBuilder
from tests.support.rebuild import state_of

ME = 7


def rebuilt_equals_replayed(stream: StreamBuilder, head_of: dict[str, int]) -> None:
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
    s = StreamBuilder()
    for seq in range(1, 8):
        s.message(ME, seq, conv=CONV_A, mention=seq == 6)
        s.message(ME, seq, conv=CONV_B, sender=ME if seq == 3 else 99)
    s.read(ME, 4, conv=CONV_A)
    s.recall(ME, 5, conv=CONV_A)
    s.entry("pin", ME, CONV_A, pin_rank=3)
    s.entry("delete_conversation", ME, CONV_B, deleted_before_conversation_seq=7)
    rebuilt_equals_replayed(s, {CONV_A: 7, CONV_B: 7})


def test_a_former_member_is_frozen_at_left_at() -> None:
    s = StreamBuilder()
    for seq in range(1, 6):
        s.message(ME, seq, sender=5)
        s.message(99, seq, sender=5)  # another member keeps receiving after ME left
    s.entry("leave", ME, CONV_A, left_at_conversation_seq=3, reason="left")
    for seq in range(6, 9):
        s.message(99, seq, sender=5)
    rebuilt_equals_replayed(s, {CONV_A: 8})


def test_a_member_who_joined_at_the_head_and_received_nothing_has_no_head() -> None:
    """Issue 11: the conversation's head (message 1) is outside the member's window (it joined
    at seq 1): replay has no head for it, and neither has the row rebuilt from state."""
    s = StreamBuilder()
    s.message(99, 1, sender=5)
    s.entry("join", ME, CONV_A, joined_at_conversation_seq=1)
    rebuilt_equals_replayed(s, {CONV_A: 1})


def test_a_former_members_head_stays_inside_its_window() -> None:
    """Joined at 2, left at 4: the head is the highest stored message in (2, 4]."""
    s = StreamBuilder()
    for seq in range(1, 7):
        s.message(99, seq, sender=5)
        if 2 < seq <= 4:
            s.message(ME, seq, sender=5)
    s.entry("join", ME, CONV_A, joined_at_conversation_seq=2)
    s.entry("leave", ME, CONV_A, left_at_conversation_seq=4, reason="removed")
    rebuilt_equals_replayed(s, {CONV_A: 6})


# -- what a rebuild from state cannot know (README "Rebuild from state"): each difference alone --


def differences(stream: StreamBuilder, head_of: dict[str, int]) -> dict[tuple[int, str], dict[str, Any]]:
    """Per (user, conversation): the fields where the row rebuilt from state differs from replay."""
    replayer = Replayer(ReplayOptions(), lambda frame: None)
    replayer.feed_many(stream.close())
    out = {}
    for row in replayer.finish().projections:
        cid = row["conversation_id"]
        stored = replayer.store.get(cid, head_of[cid])
        assert stored is not None
        head = Head(stored.conversation_seq, stored.message_id, stored.activity_id)
        rebuilt = row_from_state(row["user_id"], cid, state_of(row), head, replayer.store).as_row()
        changed = {
            k: (row[k], rebuilt[k]) for k in row if k != "projection_mailbox_seq" and row[k] != rebuilt[k]
        }
        if changed:
            out[(row["user_id"], cid)] = changed
    return out


def test_unknowable_a_recall_that_did_not_reach_a_former_member() -> None:
    """A recall delivered to the members but not to one who had left: replay keeps the message
    counted for that member (the definition is over the entries applied for it, docs/contract.md §3.6);
    state only knows the MessageStore, where the message is recalled. unread_count differs, and
    nothing else (the member is not active: its badge does not sum the row)."""
    s = StreamBuilder()
    for seq in range(1, 4):
        s.message(ME, seq, sender=5)
        s.message(99, seq, sender=5)
    s.entry("leave", ME, CONV_A, left_at_conversation_seq=3, reason="left")
    s.recall(99, 2, sender=5)  # the remaining member's entry only
    assert differences(s, {CONV_A: 3}) == {(ME, CONV_A): {"unread_count": (3, 2)}}


def test_unknowable_messages_received_during_an_earlier_membership() -> None:
    """Left at 3 and joined again at 5 with nothing since: replay's head is message 3 (received
    during the first membership, visible again); state keeps only the last join, and nothing lies
    above it. The head fields differ, and nothing else."""
    s = StreamBuilder()
    for seq in range(1, 6):
        s.message(99, seq, sender=5)
        if seq <= 3:
            s.message(ME, seq, sender=5)
    s.entry("leave", ME, CONV_A, left_at_conversation_seq=3, reason="left")
    s.entry("join", ME, CONV_A, joined_at_conversation_seq=5)
    got = differences(s, {CONV_A: 5})
    assert set(got) == {(ME, CONV_A)}
    assert set(got[(ME, CONV_A)]) == {"latest_conversation_seq", "last_message_id", "last_activity_id"}
    assert got[(ME, CONV_A)]["latest_conversation_seq"] == (3, None)
