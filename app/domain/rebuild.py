"""Rows from durable state when the mailbox log cannot be replayed (docs/contract.md §5 fill-in, §6).

UserConversationState (which conversations, flags, read/hidden/deleted watermarks, membership)
plus the MessageStore (heads, messages) give back every field of a row, with unread by the same
rules: the hand is empty, so the bounded recompute reads the MessageStore — exact when
`latest - base <= limit`, else `limit` with `unread_exact = false`.

What state cannot know exactly (README, "Rebuild from state: what state cannot know"): the row's
own `projection_mailbox_seq` (the last entry applied to the row; state keeps
`updated_mailbox_seq`, the last *state* change, and message entries do not move it); a recall
that never reached a former member (the MessageStore has it recalled for everyone); messages
received during an earlier membership (state keeps the last join only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from app.domain import seqs
from app.domain.conversation import ConversationState
from app.domain.ports import MessageStore
from app.domain.unread import UNREAD_PRECISE_LIMIT, recompute


class Head(NamedTuple):
    conversation_seq: int
    message_id: str
    activity_id: str


def _int(state: Mapping[str, Any], name: str) -> int:
    value = state.get(name)
    return int(value) if value is not None else 0


def row_from_state(
    user_id: int,
    conversation_id: str,
    state: Mapping[str, Any],
    head: Head | None,
    store: MessageStore,
    limit: int = UNREAD_PRECISE_LIMIT,
) -> ConversationState:
    """One row rebuilt from a UserConversationState row and the conversation's head."""
    row = ConversationState(user_id, conversation_id)
    row.membership = str(state.get("membership") or "active")
    row.role = str(state.get("role") or "member")
    row.joined_at = _int(state, "joined_at_conversation_seq")
    left_at = state.get("left_at_conversation_seq")
    row.left_at = int(left_at) if left_at is not None and row.membership != "active" else None
    row.read_seq = _int(state, "read_conversation_seq")
    row.hidden_before = _int(state, "hidden_before_conversation_seq")
    row.deleted_before = _int(state, "deleted_before_conversation_seq")
    pin_rank = state.get("pin_rank")
    row.pin_rank = int(pin_rank) if pin_rank is not None else None
    row.archived = bool(state.get("archived"))
    row.muted = bool(state.get("muted"))
    row.version = _int(state, "updated_mailbox_seq")
    row._rebase()
    _set_head(row, head, store, limit)
    # The hand holds nothing: it is complete only above the head. The recompute fills
    # (base, latest] from the MessageStore.
    row.floor = row.latest
    if row.latest > row.base:
        recompute(row, store, limit, received_only=False)
    return row


def _set_head(row: ConversationState, head: Head | None, store: MessageStore, limit: int) -> None:
    """The highest message in the member's window, the stand-in for "the highest visible message
    received" (docs/contract.md §3.7) that state can give: above `joined_at` (a member receives the
    messages after its join), and at or below `left_at` for a former member. clear_history and
    delete_conversation move the base, not the head. Below the conversation head, the highest
    stored message of the window is searched in bounded windows."""
    if head is None or head.conversation_seq <= row.joined_at:
        return  # nothing in the member's window (joined at the head and received nothing since)
    if row.left_at is None or head.conversation_seq <= row.left_at:
        row.head_seq = head.conversation_seq
        row.set_head_ids(head.message_id, head.activity_id)
        row.received = seqs.add(row.received, head.conversation_seq)
        return
    upto = row.left_at
    while upto > row.joined_at:
        window = store.range(row.conversation_id, max(row.joined_at, upto - limit), upto)
        if window:
            top = window[-1]
            row.head_seq = top.conversation_seq
            row.set_head_ids(top.message_id, top.activity_id)
            row.received = seqs.add(row.received, top.conversation_seq)
            return
        upto -= limit


def as_replay_base(row: ConversationState) -> ConversationState:
    """A row rebuilt from state, made the base that later mailbox entries are applied on (a
    rebuild by replay from a timestamp).

    The core's recomputes read the MessageStore only for messages the user *received* (the
    definition is over the user's own entries, docs/contract.md §3.6). A row from state knows no receipt
    history: like its own recompute (which takes the MessageStore as it is), it takes every
    stored message up to its head as received. A later entry for one of them is then a
    message counted once, not a message counted for the first time.
    """
    if row.head_seq:
        row.received = seqs.add_range(row.received, 1, row.head_seq + 1)
    return row
