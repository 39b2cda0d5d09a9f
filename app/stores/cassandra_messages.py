"""The Cassandra MessageStore (tables ``messages`` and ``conversation_heads``, app/stores/schema.py).

Read side: the :class:`~app.domain.ports.MessageStore` port the core calls *inline and
synchronously* (rarely: a bounded unread recompute, a head lookup on leave), so every read is one
prepared, single-partition query. Write side: what the simulator (and tests) use to put the
messages there before the mailbox entries that mention them are produced.

Choices worth knowing:

* ``messages`` clusters newest first (``conversation_seq DESC``), which suits "the partition's
  first row is the head" and "the last 200 below latest". :meth:`CassandraMessageStore.range`
  reads in the table's own order and reverses in Python rather than asking Cassandra for
  ``ORDER BY ... ASC``: a reversed slice is the slower path inside Cassandra, a 200-element list
  reversal is nothing.
* A recall (or delete-for-everyone) may reach the store before its message. ``mark_recalled`` is
  an upsert, so it leaves a row holding only the flag; ``put_messages`` never writes the flags,
  so the message arriving later keeps it. A row without ``message_id`` is "recall seen, message
  not yet": reads skip it, exactly as :class:`~app.stores.memory_messages.InMemoryMessageStore`
  does.
* Mentions accumulate (``mentions = mentions + ?``), whether they come with the message or later
  through :meth:`add_mentions`: an INSERT would replace the whole set.
* ``conversation_heads`` only moves forward, without a read and without LWT: every head write
  carries ``USING TIMESTAMP <conversation_seq>``, so Cassandra's last-write-wins *is* "highest
  seq wins", idempotently, and the three head columns always come from one message (same
  cell timestamp). An LWT (``IF latest_conversation_seq < ?``) would cost a Paxos round per
  message, fail on a missing row, and serialize concurrent writers; read-compare-write races.
  Consequence: every writer of ``conversation_heads`` must use :meth:`update_head` (a plain
  write stamped with wall-clock microseconds would pin the row forever), and deleting a head
  needs ``DELETE ... USING TIMESTAMP`` above the seqs written.
* Statements run at LOCAL_QUORUM: a message the simulator (or the message service) wrote must be
  visible to whichever worker reads it after consuming the mailbox entry, on any replica.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from app.domain.ports import StoredMessage
from app.stores.cassandra_exec import (
    StoreError,
    Write,
    checked_keyspace,
    execute_all,
    group_by_partition,
    prepare_statement,
)
from app.stores.schema import activity_from_blob, activity_to_blob, check_user_id


class NewMessage(NamedTuple):
    """A message as its writer knows it (the write side's input)."""

    conversation_id: str
    conversation_seq: int
    message_id: str
    activity_id: str  # 32 lowercase hex chars
    sender_id: int
    created_at: int  # ms since epoch
    counts_unread: bool = True
    mentions: frozenset[int] = frozenset()  # users it mentions (@all expanded)


class ConversationHead(NamedTuple):
    """The latest message of a conversation (fills rows missing from the projection store)."""

    conversation_id: str
    latest_conversation_seq: int
    last_message_id: str
    last_activity_id: str


_COLUMNS = "conversation_seq, message_id, activity_id, sender_id, counts_unread, mentions, recalled, deleted"


class CassandraMessageStore:
    """MessageStore port (sync reads) plus the writer methods, over one driver session."""

    def __init__(self, session: Any, keyspace: str) -> None:

        self.session = session
        self.keyspace = keyspace
        ks = checked_keyspace(keyspace)

        def prepare(template: str) -> Any:
            return prepare_statement(session, ks, "MessageStore", template, columns=_COLUMNS)

        self._range = prepare(
            "SELECT {columns} FROM {ks}.messages"
            " WHERE conversation_id = ? AND conversation_seq > ? AND conversation_seq <= ?"
        )
        self._get = prepare(
            "SELECT {columns} FROM {ks}.messages WHERE conversation_id = ? AND conversation_seq = ?"
        )
        # UPDATE, not INSERT: an upsert that merges mentions and leaves a recall flag alone.
        self._put = prepare(
            "UPDATE {ks}.messages SET message_id = ?, activity_id = ?, sender_id = ?,"
            " created_at = ?, counts_unread = ?, mentions = mentions + ?"
            " WHERE conversation_id = ? AND conversation_seq = ?"
        )
        self._add_mentions = prepare(
            "UPDATE {ks}.messages SET mentions = mentions + ?"
            " WHERE conversation_id = ? AND conversation_seq = ?"
        )
        self._recall = prepare(
            "UPDATE {ks}.messages SET recalled = true WHERE conversation_id = ? AND conversation_seq = ?"
        )
        self._delete = prepare(
            "UPDATE {ks}.messages SET deleted = true WHERE conversation_id = ? AND conversation_seq = ?"
        )
        self._put_head = prepare(
            "UPDATE {ks}.conversation_heads USING TIMESTAMP ?"
            " SET latest_conversation_seq = ?, last_message_id = ?, last_activity_id = ?"
            " WHERE conversation_id = ?"
        )
        self._get_head = prepare(
            "SELECT latest_conversation_seq, last_message_id, last_activity_id"
            " FROM {ks}.conversation_heads WHERE conversation_id = ?"
        )

    # -- MessageStore port (the core calls these inline) ---------------------------------------

    def range(self, conversation_id: str, after_seq: int, upto_seq: int) -> Sequence[StoredMessage]:
        if upto_seq <= after_seq:
            return []
        rows = self._execute(self._range, (uuid.UUID(conversation_id), after_seq, upto_seq), "range")
        out = [_stored(row) for row in rows if row.message_id is not None]
        out.reverse()  # the table is newest first; the port promises ascending
        return out

    def get(self, conversation_id: str, conversation_seq: int) -> StoredMessage | None:
        rows = self._execute(self._get, (uuid.UUID(conversation_id), conversation_seq), "get")
        row = rows.one()
        if row is None or row.message_id is None:
            return None
        return _stored(row)

    # -- write side ------------------------------------------------------------------------------

    def put_messages(self, messages: Iterable[NewMessage]) -> int:
        """Upsert messages: one UNLOGGED batch per conversation (chunked), partitions concurrently.
        Returns how many messages were written."""
        writes: list[Write] = []
        for m in messages:
            cid = uuid.UUID(m.conversation_id)
            params = (
                m.message_id,
                activity_to_blob(m.activity_id),
                check_user_id(m.sender_id),
                m.created_at,
                m.counts_unread,
                {check_user_id(u) for u in m.mentions},
                cid,
                m.conversation_seq,
            )
            writes.append((cid, self._put, params))
        execute_all(self.session, group_by_partition(writes), what="put_messages")
        return len(writes)

    def mark_recalled(self, conversation_id: str, conversation_seq: int, deleted: bool = False) -> None:
        """Recall (or, with ``deleted``, delete for everyone); either makes the message stop
        counting. Works before the message itself is stored."""
        statement = self._delete if deleted else self._recall
        self._execute(statement, (uuid.UUID(conversation_id), conversation_seq), "mark_recalled")

    def mark_recalled_many(self, targets: Iterable[tuple[str, int, bool]]) -> int:
        """Several ``(conversation_id, conversation_seq, deleted)`` at once, batched like
        :meth:`put_messages`. Returns how many."""
        writes: list[Write] = []
        for conversation_id, seq, deleted in targets:
            cid = uuid.UUID(conversation_id)
            writes.append((cid, self._delete if deleted else self._recall, (cid, seq)))
        execute_all(self.session, group_by_partition(writes), what="mark_recalled")
        return len(writes)

    def add_mentions(self, conversation_id: str, conversation_seq: int, user_ids: Iterable[int]) -> None:
        users = {check_user_id(u) for u in user_ids}
        if users:
            params = (users, uuid.UUID(conversation_id), conversation_seq)
            self._execute(self._add_mentions, params, "add_mentions")

    def update_head(self, conversation_id: str, seq: int, message_id: str, activity_id: str) -> None:
        """Move the conversation's head to ``seq`` unless it already is at or past it."""
        self.update_heads([ConversationHead(conversation_id, seq, message_id, activity_id)])

    def update_heads(self, heads: Iterable[ConversationHead]) -> int:
        """Several heads at once (one statement per conversation: the highest seq given for
        it). Forward only, see the module docstring. Returns how many conversations."""
        best: dict[str, ConversationHead] = {}
        for head in heads:
            if head.latest_conversation_seq < 1:
                raise ValueError(f"a head needs conversation_seq >= 1, got {head!r}")
            known = best.get(head.conversation_id)
            if known is None or head.latest_conversation_seq > known.latest_conversation_seq:
                best[head.conversation_id] = head
        statements = [
            (
                self._put_head,
                (
                    h.latest_conversation_seq,  # the write timestamp: highest seq wins
                    h.latest_conversation_seq,
                    h.last_message_id,
                    activity_to_blob(h.last_activity_id),
                    uuid.UUID(h.conversation_id),
                ),
            )
            for h in best.values()
        ]
        execute_all(self.session, statements, what="update_heads")
        return len(statements)

    def heads(self, conversation_ids: Iterable[str]) -> dict[str, ConversationHead]:
        """The stored head of each conversation that has one (concurrent single-partition reads:
        an ``IN`` over partition keys would make one coordinator wait for all of them)."""
        ids = list(dict.fromkeys(conversation_ids))
        statements = [(self._get_head, (uuid.UUID(cid),)) for cid in ids]
        results = execute_all(self.session, statements, what="heads")
        out: dict[str, ConversationHead] = {}
        for cid, rows in zip(ids, results, strict=True):
            row = rows.one()
            if row is not None and row.latest_conversation_seq is not None:
                out[cid] = ConversationHead(
                    cid,
                    row.latest_conversation_seq,
                    row.last_message_id,
                    activity_from_blob(row.last_activity_id),
                )
        return out

    # ------------------------------------------------------------------------------------------

    def _execute(self, statement: Any, params: Sequence[Any], what: str) -> Any:
        try:
            return self.session.execute(statement, params)
        except Exception as exc:  # driver errors have no common base worth naming
            raise StoreError(f"cassandra {what} failed: {type(exc).__name__}: {exc}") from None


def _stored(row: Any) -> StoredMessage:
    return StoredMessage(
        conversation_seq=row.conversation_seq,
        message_id=row.message_id,
        activity_id=activity_from_blob(row.activity_id),
        sender_id=row.sender_id,
        counts_unread=bool(row.counts_unread),
        recalled=bool(row.recalled or row.deleted),
        mentions=frozenset(row.mentions or ()),
    )
