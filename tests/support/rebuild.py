"""Rebuild from state's inputs built from a replay: UserConversationState rows and the
MessageStore heads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from app.replay import Replayer


def state_of(row: dict[str, Any]) -> dict[str, Any]:
    """The UserConversationState fields of a projection row (what rebuild from state reads)."""
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


class StoredHead(NamedTuple):
    """A conversation's newest message as the MessageStore's heads query answers it."""

    conversation_id: str
    latest_conversation_seq: int
    last_message_id: str
    last_activity_id: str


class FakeHeads:
    """The MessageStore's heads of a replayed stream: conversation -> its message `top[cid]`."""

    def __init__(self, replayer: Replayer, top: dict[str, int]) -> None:
        self.replayer = replayer
        self.top = top

    def heads(self, conversation_ids: Iterable[str]) -> Mapping[str, StoredHead]:
        out = {}
        for cid in conversation_ids:
            m = self.replayer.store.get(cid, self.top[cid])
            assert m is not None
            out[cid] = StoredHead(cid, m.conversation_seq, m.message_id, m.activity_id)
        return out
