"""What the worker core needs from faust and Kafka, as Protocols."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from app.domain.conversation_ids import conversation_uuid_bytes


class RawRecord(NamedTuple):
    """One Kafka record of the mailbox-tail topic, undecoded."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


def raw_record(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None) -> RawRecord:
    """A consumed record as the core takes it: a null value becomes empty (dead-lettered)."""
    return RawRecord(topic, partition, offset, key, value if value is not None else b"")


# -- the changelog tables' layout: keys sort as the state (user id: 8 big-endian bytes, then the
# conversation's 16 UUID bytes); one partition per store, so no partition in the key.
CHECKPOINT_KEY = b"gate"  # the on-disk key (and RocksDB folder "gates"), kept from before the rename


def user_key(user_id: int) -> bytes:
    return user_id.to_bytes(8, "big")


def row_key(user_id: int, conversation_id: str) -> bytes:
    return user_id.to_bytes(8, "big") + conversation_uuid_bytes(conversation_id)


def pending_key(user_id: int, mailbox_seq: int) -> bytes:
    return user_id.to_bytes(8, "big") + mailbox_seq.to_bytes(8, "big")


def parse_row_key(key: bytes) -> tuple[int, str]:
    # str(uuid.UUID(bytes=...)) spelled out: 3x cheaper, and every row read parses its key.
    h = key[8:24].hex()
    if len(h) != 32:
        raise ValueError(f"a row key has 24 bytes, not {len(key)}")
    return int.from_bytes(key[:8], "big"), f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def parse_user_key(key: bytes) -> int:
    return int.from_bytes(key[:8], "big")


class StateTables(Protocol):
    """The worker's state tables (tables/durable in production); every call names its partition."""

    async def acquire(self, partitions: Sequence[int]) -> None:
        """These partitions are this worker's from now on: caught up and claimed before any read."""
        ...

    def hand_over(self, partition: int) -> None:
        """The partition's last persist here is done: another worker writes it next."""
        ...

    def put_row(self, partition: int, user_id: int, conversation_id: str, blob: bytes) -> None: ...

    def put_user(self, partition: int, user_id: int, blob: bytes) -> None: ...

    def put_checkpoint_record(self, partition: int, blob: bytes, next_offset: int | None = None) -> None:
        """The partition's record (watermark lanes, flush bookkeeping) and the mailbox-tail offset
        below which every entry is in this state (None: not placed yet)."""
        ...

    def put_pending(self, partition: int, user_id: int, mailbox_seq: int, raw: bytes) -> None: ...

    def delete_pending(self, partition: int, user_id: int, mailbox_seq: int) -> None: ...

    async def commit(self) -> None:
        """End of a persist: every write since the last commit durable and readable (not before),
        atomically per partition: a commit that raises left all of a partition's writes or none."""
        ...

    def get_users(self, partition: int, user_ids: Collection[int]) -> dict[int, bytes]:
        """The users' records that exist (one multi-get)."""
        ...

    def get_rows(self, partition: int, keys: Collection[tuple[int, str]]) -> dict[tuple[int, str], bytes]:
        """The rows' records that exist (one multi-get)."""
        ...

    def user_rows(self, partition: int, user_id: int) -> list[tuple[str, bytes]]:
        """Every row of the user (one prefix scan), by conversation id."""
        ...

    def row_keys(self, partition: int) -> Iterator[tuple[int, str]]:
        """Every row's (user, conversation), in key order, values not read."""
        ...

    def rows_after(
        self, partition: int, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[tuple[int, str], bytes]]:
        """At most `limit` rows above `after` (None: from the first), in key order; callable from a
        worker thread."""
        ...

    def row_key_bounds(self, partition: int) -> tuple[tuple[int, str], tuple[int, str]] | None:
        """The first and the last row's (user, conversation) in key order (None: no rows)."""
        ...

    def estimated_rows(self, partition: int) -> int:
        """About how many rows the partition holds, cheaply (RocksDB's estimate of its keys)."""
        ...

    def checkpoint_record(self, partition: int) -> bytes | None: ...

    def pending(self, partition: int) -> list[bytes]:
        """The waiting entries' raw records."""
        ...


class Outbox(Protocol):
    """Records the worker produces: frames, member notices and dead letters."""

    async def dead_letters(self, letters: Sequence[tuple[bytes | None, bytes]]) -> None: ...

    async def frames(
        self, session_deltas: Sequence[tuple[bytes, bytes]], badges: Sequence[tuple[bytes, bytes]]
    ) -> None: ...

    async def notices(self, notices: Sequence[tuple[bytes, bytes]]) -> None:
        """MEMBER_NOTICE frames (key = user id), in order with its SESSION_DELTA frames (§9)."""
        ...


class StateWriter(Protocol):
    """Batched UserConversationState / group_members persistence (Cassandra)."""

    def stage(self, user_id: int, conversation_id: str, fields: dict[str, object]) -> None: ...

    def stage_member(
        self,
        conversation_id: str,
        user_id: int,
        role: str | None,
        state: str,
        joined_at: int | None,
        left_at: int | None,
    ) -> None: ...

    def stage_member_stats(
        self, conversation_id: str, user_id: int, record_count: int, mention_count: int, mailbox_seq: int
    ) -> None: ...

    async def flush(self) -> int: ...

    def owed(self) -> dict[tuple[int, str], dict[str, Any]]:
        """Staged and not written yet, per (user, conversation), as plain values."""
        ...

    def restage(self, user_id: int, conversation_id: str, owed: Mapping[str, Any]) -> None:
        """Stage again what `owed` returned before a restart."""
        ...

    def drop(self, keys: Iterable[tuple[int, str]]) -> None:
        """Forget what is staged for these (user, conversation) keys (another worker owes it now)."""
        ...


class FlushObserver(Protocol):
    """Told how long each flush took; the counters are pulled from the core's stats instead."""

    def observe_flush(self, seconds: float) -> None: ...
