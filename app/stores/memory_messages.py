"""An in-memory MessageStore: replay mode's store, fed by the entries replay applies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.ports import StoredMessage


@dataclass(slots=True)
class _Message:
    message_id: str = ""
    activity_id: str = ""
    sender_id: int = 0
    counts_unread: bool = False
    present: bool = False  # False while only a recall has been seen (recall before message)
    recalled: bool = False
    # None until the first mention (most messages mention no one), then a list: a set of a
    # group's 10 members took ~730 bytes, the list ~180. Each recipient's entry names only itself
    # and is applied once, so a user is listed once (a frozenset is made when it is read anyway).
    mentions: list[int] | None = None


_NO_MENTIONS: frozenset[int] = frozenset()


class InMemoryMessageStore:
    """Messages per conversation, keyed by conversation_seq."""

    def __init__(self) -> None:
        self._conversations: dict[str, dict[int, _Message]] = {}

    def _slot(self, conversation_id: str, seq: int) -> _Message:
        messages = self._conversations.setdefault(conversation_id, {})
        message = messages.get(seq)
        if message is None:
            message = messages[seq] = _Message()
        return message

    def record_message(
        self,
        conversation_id: str,
        seq: int,
        *,
        message_id: str,
        activity_id: str,
        sender_id: int,
        counts_unread: bool,
        mentioned_user: int | None,
    ) -> None:
        """Store a message as one recipient's entry describes it; mentions accumulate."""
        message = self._slot(conversation_id, seq)
        if not message.present:
            message.message_id = message_id
            message.activity_id = activity_id
            message.sender_id = sender_id
            message.counts_unread = counts_unread
            message.present = True
        if mentioned_user is not None:
            if message.mentions is None:
                message.mentions = [mentioned_user]
            else:
                message.mentions.append(mentioned_user)

    def record_recall(self, conversation_id: str, seq: int) -> None:
        """Recall or delete-for-everyone; may arrive before the message itself."""
        self._slot(conversation_id, seq).recalled = True

    def _stored(self, seq: int, message: _Message) -> StoredMessage:
        return StoredMessage(
            conversation_seq=seq,
            message_id=message.message_id,
            activity_id=message.activity_id,
            sender_id=message.sender_id,
            counts_unread=message.counts_unread,
            recalled=message.recalled,
            mentions=frozenset(message.mentions) if message.mentions else _NO_MENTIONS,
        )

    def range(self, conversation_id: str, after_seq: int, upto_seq: int) -> Sequence[StoredMessage]:
        messages = self._conversations.get(conversation_id, {})
        if upto_seq - after_seq < len(messages):
            seqs = (s for s in range(after_seq + 1, upto_seq + 1) if s in messages)
        else:
            seqs = (s for s in sorted(messages) if after_seq < s <= upto_seq)
        return [self._stored(s, messages[s]) for s in seqs if messages[s].present]

    def get(self, conversation_id: str, conversation_seq: int) -> StoredMessage | None:
        message = self._conversations.get(conversation_id, {}).get(conversation_seq)
        if message is None or not message.present:
            return None
        return self._stored(conversation_seq, message)
