"""Member statistics as stream aggregates: ``record_count`` and ``mention_count`` per
(group, member), derived from the member's own mailbox entries (docs/contract.md §8).

Why bitmaps and absolute values, not counters:

* A Cassandra counter (or any ``+= 1``) is not idempotent: a replay after a crash, a duplicate
  that slipped past a lost changelog, or a rebuild would count the same message twice, and a
  counter can never be repaired by writing it again.
* Here each (group, member) keeps three sets of conversation seqs: ``sent`` (messages the
  member sent: the sender's own copy, ``sender_id == user_id``), ``mentioned`` (messages
  whose entry for this member says ``mention``: @all included, as the session list counts
  it), and ``gone`` (targets of ``recall`` / ``delete_message`` entries that concern this
  member's sent or mentioned messages). Adding a seq to a set twice is a no-op, so applying
  an entry twice changes nothing; the counts are cardinalities of set differences:
  ``record_count = |sent - gone|``, ``mention_count = |mentioned - gone|``.
  A recall that arrives before its message is already in ``gone`` when the message comes.
* The worker writes the *values* (never increments) with the mailbox_seq of the entry that
  produced them as the Cassandra write timestamp: rewriting is harmless, and an older state
  cannot overwrite a newer one.

Scope (documented limits): a member who has left receives no more entries, so a recall of
one of their old messages after they left does not reach these sets (the MessageStore has
it; the statistics stay as they were when the member left). ``delete_message`` is treated like
a recall: both are visible to the whole group (the MessageStore keeps ``deleted`` per message).

Pure: stdlib + pyroaring, no I/O; the worker keeps one per (user, conversation) next to the
row and persists it in the same changelog record.
"""

from __future__ import annotations

from typing import Any

from pyroaring import BitMap64

from app.domain import seqs
from app.domain.entries import DeleteMessageEntry, Entry, MessageEntry, RecallEntry

# The object itself (three slots) besides its sets (`MemberStats.footprint`).
STATS_BYTES = 64


class MemberStats:
    __slots__ = ("gone", "mentioned", "sent")

    def __init__(self) -> None:
        self.sent = BitMap64()
        self.mentioned = BitMap64()
        self.gone = BitMap64()

    @property
    def record_count(self) -> int:
        return int(self.sent.difference_cardinality(self.gone))

    @property
    def mention_count(self) -> int:
        return int(self.mentioned.difference_cardinality(self.gone))

    @staticmethod
    def concerns(user_id: int, entry: Entry) -> bool:
        """Whether ``entry`` can touch ``user_id``'s statistics at all: the worker asks this
        first, so the common entry (someone else's message, no mention) costs no allocation."""
        kind = type(entry)
        if kind is MessageEntry:
            return entry.sender_id == user_id or entry.mention  # type: ignore[union-attr]
        if kind is RecallEntry or kind is DeleteMessageEntry:
            return entry.target_sender_id == user_id or entry.target_mention  # type: ignore[union-attr]
        return False

    def counts(self) -> tuple[int, int]:
        return self.record_count, self.mention_count

    def apply(self, user_id: int, entry: Entry) -> bool:
        """Fold one applied entry of ``user_id``'s mailbox in; True when a count changed."""
        kind = type(entry)
        if kind is MessageEntry:
            message: MessageEntry = entry  # type: ignore[assignment]  # narrowed by the `is` check
            if message.sender_id != user_id and not message.mention:
                return False  # the common case in a big group: nothing to do
            before = self.counts()
            seq = message.conversation_seq
            if message.sender_id == user_id:
                self.sent.add(seq)
            if message.mention:
                self.mentioned.add(seq)
            return self.counts() != before
        if kind is RecallEntry or kind is DeleteMessageEntry:
            target: RecallEntry | DeleteMessageEntry = entry  # type: ignore[assignment]
            if target.target_sender_id != user_id and not target.target_mention:
                return False  # concerns neither this member's messages nor their mentions
            before = self.counts()
            self.gone.add(target.target_conversation_seq)
            return self.counts() != before
        return False

    def footprint(self) -> int:
        """About how many bytes the statistics hold in memory (three 64-bit roaring sets: ~1.2
        KiB by RSS with a seq in two of them): the hot set's byte bound counts them with their
        row (app/domain/residency.py)."""
        return (
            STATS_BYTES
            + seqs.footprint(self.sent)
            + seqs.footprint(self.mentioned)
            + seqs.footprint(self.gone)
        )

    @property
    def empty(self) -> bool:
        return not (self.sent or self.mentioned or self.gone)

    def dump(self) -> dict[str, Any]:
        return {
            "sent": self.sent.serialize(),
            "mentioned": self.mentioned.serialize(),
            "gone": self.gone.serialize(),
        }

    @classmethod
    def load(cls, state: dict[str, Any]) -> MemberStats:
        stats = cls()
        stats.sent = BitMap64.deserialize(state["sent"])
        stats.mentioned = BitMap64.deserialize(state["mentioned"])
        stats.gone = BitMap64.deserialize(state["gone"])
        return stats
