"""Replay's learning MessageStore in a RocksDB folder (`projector replay --state-dir`).

The in-memory store (app/stores/memory_messages.py) holds every message a replay has seen:
~500-800 bytes each, so a replay's memory grew with its messages even when its rows lived on
disk. This one keeps them in RocksDB next to the state tables; memory holds only the messages
learned since the last `commit` (the driver commits after every chunk of input, with the
tables), where the rest of a message's fan-out finds them without a disk read.

It answers exactly as the in-memory store does (the MessageStore contract suite runs against
both): a message is present once a recipient's entry has described it, mentions accumulate, a
recall may come first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
from rocksdict import Rdict, WriteBatch

from app.domain.conversation_ids import conversation_uuid_bytes
from app.domain.ports import StoredMessage
from app.stores.rocks_tables import memtable_bytes

# A message's record, in the order the value holds it: [message_id, activity_id, sender_id,
# counts_unread, present, recalled, mentions (sorted list)].
_MESSAGE_ID, _ACTIVITY_ID, _SENDER_ID, _COUNTS_UNREAD, _PRESENT, _RECALLED, _MENTIONS = range(7)
_SEQ_BYTES = 8
_SEQ_MAX = (1 << 64) - 1


def _key(conversation_id: str, seq: int) -> bytes:
    # Conversation then seq, big-endian: a conversation's messages are one ordered key range.
    return conversation_uuid_bytes(conversation_id) + seq.to_bytes(_SEQ_BYTES, "big")


def _blank() -> list[Any]:
    return ["", "", 0, False, False, False, []]


class RocksMessageStore:
    """The learning MessageStore over one RocksDB database (`options`: rocksdict Options)."""

    def __init__(self, folder: Path, options: Any) -> None:
        self._db: Any = Rdict(str(folder), options)  # raw mode: bytes keys and values
        # Learned since the last commit: (conversation, seq) -> record (mutable, written at commit).
        self._recent: dict[tuple[str, int], list[Any]] = {}
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder(list[Any]).decode

    def _record(self, conversation_id: str, seq: int) -> list[Any] | None:
        record = self._recent.get((conversation_id, seq))
        if record is None:
            blob = self._db.get(_key(conversation_id, seq))
            if blob is not None:
                record = self._decode(blob)
        return record

    def _writable(self, conversation_id: str, seq: int) -> list[Any]:
        record = self._record(conversation_id, seq)
        if record is None:
            record = _blank()
        self._recent[(conversation_id, seq)] = record
        return record

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
        record = self._recent.get((conversation_id, seq))
        if record is None:
            record = self._record(conversation_id, seq)
            if (
                record is not None
                and record[_PRESENT]
                and (mentioned_user is None or mentioned_user in record[_MENTIONS])
            ):
                return  # the rest of a fan-out: nothing new (no write)
            record = self._writable(conversation_id, seq)
        if not record[_PRESENT]:
            record[_MESSAGE_ID] = message_id
            record[_ACTIVITY_ID] = activity_id
            record[_SENDER_ID] = sender_id
            record[_COUNTS_UNREAD] = counts_unread
            record[_PRESENT] = True
        if mentioned_user is not None and mentioned_user not in record[_MENTIONS]:
            record[_MENTIONS].append(mentioned_user)

    def record_recall(self, conversation_id: str, seq: int) -> None:
        """Recall or delete-for-everyone; may arrive before the message itself."""
        self._writable(conversation_id, seq)[_RECALLED] = True

    def commit(self) -> None:
        """Write what was learned since the last commit; memory keeps none of it."""
        if not self._recent:
            return
        batch = WriteBatch(raw_mode=True)
        encode = self._encode
        for (conversation_id, seq), record in self._recent.items():
            batch.put(_key(conversation_id, seq), encode(record))
        self._db.write(batch)
        self._recent.clear()

    def memtable_bytes(self, *, active_only: bool = False) -> int:
        """What the database's memtables hold now (app.stores.rocks_tables.memtable_bytes)."""
        return memtable_bytes(self._db, active_only=active_only)

    def close(self) -> None:
        self.commit()
        self._db.close()

    # -- MessageStore ---------------------------------------------------------------------------

    @staticmethod
    def _stored(seq: int, record: list[Any]) -> StoredMessage:
        return StoredMessage(
            conversation_seq=seq,
            message_id=record[_MESSAGE_ID],
            activity_id=record[_ACTIVITY_ID],
            sender_id=record[_SENDER_ID],
            counts_unread=record[_COUNTS_UNREAD],
            recalled=record[_RECALLED],
            mentions=frozenset(record[_MENTIONS]),
        )

    def range(self, conversation_id: str, after_seq: int, upto_seq: int) -> Sequence[StoredMessage]:
        first = max(after_seq + 1, 0)  # seqs are u64: the bounds may lie outside
        if upto_seq < first or first > _SEQ_MAX:
            return []
        self.commit()  # one ordered scan of the database then sees everything learned
        prefix = conversation_uuid_bytes(conversation_id)
        start = prefix + first.to_bytes(_SEQ_BYTES, "big")
        out = []
        decode = self._decode
        for key, blob in self._db.items(from_key=start):
            if not key.startswith(prefix):
                break
            seq = int.from_bytes(key[len(prefix) :], "big")
            if seq > upto_seq:
                break
            record = decode(blob)
            if record[_PRESENT]:
                out.append(self._stored(seq, record))
        return out

    def get(self, conversation_id: str, conversation_seq: int) -> StoredMessage | None:
        if not 0 <= conversation_seq <= _SEQ_MAX:
            return None
        record = self._record(conversation_id, conversation_seq)
        if record is None or not record[_PRESENT]:
            return None
        return self._stored(conversation_seq, record)
